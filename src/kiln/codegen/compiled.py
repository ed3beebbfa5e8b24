"""`CompiledGraph`: the callable `compile_graph` returns, and the namespace its wrapper runs in.

Takes the loaded kernel library, the rendered kernels and wrapper, and the graph's constants;
gives the wrapper's globals (`make_namespace`: kernels, ATen ops, allocation helpers) and a
callable object that keeps the schedule and both sources for inspection (tests assert on
`.cpp_source`, `.wrapper_source`, `.schedule`).

Why it exists: the generated program should stay a plain function; what it needs from kiln is
listed here, in one dictionary, instead of being imported inside generated text.
"""

from __future__ import annotations

import torch

from ..runtime import native
from ..schedule import Schedule
from ..schedule.arena import new_block as _new_arena
from .bindings import fast_externs


def _empty(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


def _fix_input(t: torch.Tensor, name: str, size, stride) -> torch.Tensor:
    """An input whose strides differ from the compiled ones is copied into those strides."""
    if tuple(t.shape) != tuple(size):
        raise RuntimeError(
            f"kiln: input {name} has shape {tuple(t.shape)}, but this graph was compiled for "
            f"{tuple(size)}; recompile for the new shape."
        )
    if t.device.type != "cpu":
        raise RuntimeError(f"kiln: input {name} is on {t.device}; this graph runs on the CPU")
    out = torch.empty_strided(size, stride, dtype=t.dtype, device="cpu")
    out.copy_(t)
    return out


def make_namespace(lib, module, wrapper, constants: dict) -> dict:
    ns: dict = {
        "torch": torch,
        "_empty": _empty,
        "_as_strided": native.as_strided(),
        "_fix_input": _fix_input,
        "_new_arena": _new_arena,
        "_arenas": [],  # this graph's arenas between calls (schedule/arena.py)
    }
    for k in module.kernels:
        ns[k.name] = getattr(lib, k.name)
    ns.update(fast_externs(wrapper.externs))
    ns.update(constants)
    return ns


class CompiledGraph:
    def __init__(self, fn, sched: Schedule, cpp_source: str, wrapper_source: str, seconds: float):
        self._fn = fn
        self.schedule = sched
        self.cpp_source = cpp_source
        self.wrapper_source = wrapper_source
        self.compile_seconds = seconds

    _boxed_call = True  # the wrapper takes one list of inputs and empties it

    def __call__(self, *args):
        """`compiled([x, y])` (boxed: the list is emptied, so inputs die inside the graph)
        or `compiled(x, y)`."""
        if len(args) == 1 and type(args[0]) is list:
            return self._fn(args[0])
        return self._fn(list(args))

    @property
    def kernel_count(self) -> int:
        return len(self.schedule.kernels)

    def __repr__(self) -> str:
        return (
            f"<kiln CompiledGraph: {self.kernel_count} kernels, "
            f"compiled in {self.compile_seconds:.3f}s>"
        )
