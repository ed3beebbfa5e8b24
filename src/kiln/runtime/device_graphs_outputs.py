"""Outputs of device-graph replays, and the step marker `kiln.mark_step_begin()`.

A replayed graph writes its outputs into the same static buffers every time, so a tensor handed
out by replay k is overwritten by replay k+1. This module gives those tensors a way to say so:
each replay returns `GraphOutput`s, a light tensor subclass that aliases the static buffer and
remembers the `Generation` (one counter per captured graph) and the count it was made at. Its
`__torch_function__` checks the count before any torch operation reads it and raises
`OverwrittenOutputError`, which tells the user to clone it or mark step boundaries. Results of
operations on a `GraphOutput` are plain tensors (the subclass does not spread), so the check
costs one Python call per direct use of a graph output and nothing downstream.

Why a subclass and not a storage check: the static buffer stays alive inside the graph, so
nothing about the storage changes when it is overwritten; only a per-tensor tag can tell an old
output from the current one.

`mark_step_begin()` bumps a process-wide step number: device-graph wrappers treat everything
handed out before it as dead (a training forward need not wait for the backward of an earlier
call before replaying).
"""

from __future__ import annotations

import torch

_step = [0]


def mark_step_begin() -> None:
    """Start a new step: outputs of earlier device-graph replays may be overwritten freely.

    Call it at the top of each iteration when a compiled function (under `mode="reduce-overhead"`
    or `backend="cudagraphs"`) runs several times before a backward, or when earlier outputs are
    deliberately discarded."""
    _step[0] += 1


def current_step() -> int:
    return _step[0]


class OverwrittenOutputError(RuntimeError):
    pass


class Generation:
    """How many times one captured graph has replayed; outputs carry the count they saw."""

    __slots__ = ("count", "label")

    def __init__(self, label: str):
        self.count = 0
        self.label = label


_MESSAGE = (
    "kiln: this tensor is an output of a device-graph replay of {label} (mode='reduce-overhead' "
    "or backend='cudagraphs') and a later replay has overwritten it (it came from replay {old}, "
    "the graph has replayed {new} times). Clone it (`out.clone()`) before calling the compiled "
    "function again, or call kiln.mark_step_begin() at the start of each step and stop using "
    "outputs of earlier steps."
)


def check_output(value: GraphOutput) -> None:
    """Raise `OverwrittenOutputError` if a later replay has overwritten `value`."""
    gen = value._kiln_generation
    if gen is not None and gen.count != value._kiln_count:
        raise OverwrittenOutputError(
            _MESSAGE.format(label=gen.label, old=value._kiln_count, new=gen.count)
        )


def _check(value) -> None:
    if isinstance(value, GraphOutput):
        check_output(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, (GraphOutput, list, tuple)):
                _check(v)


class GraphOutput(torch.Tensor):
    """A tensor aliasing a graph's static output buffer, valid until that graph replays again."""

    _kiln_generation: Generation | None = None
    _kiln_count = 0

    @staticmethod
    def wrap(static: torch.Tensor, generation: Generation) -> GraphOutput:
        out = torch.Tensor._make_subclass(GraphOutput, static, False)
        out._kiln_generation = generation
        out._kiln_count = generation.count
        return out

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        _check(args)
        _check(tuple(kwargs.values()))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)
