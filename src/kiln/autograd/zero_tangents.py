"""Backward graphs for calls where some outputs get no gradient: their tangents are zeros.

Takes the partition's backward `GraphModule` (placeholders: saved values, saved sizes, then one
tangent per differentiable forward output) and the backward compiler; gives, per set of absent
tangents, a compiled backward taking the same inputs less those tangents, in which each absent
tangent is a zeros fill the code generator folds into the kernels that read it (`x + 0` reads
nothing).

Why it exists: autograd hands a custom Function a tensor of zeros for every output whose
gradient is None. A Hugging Face model called with `labels=` returns the logits beside the
loss, and a training loop backpropagates the loss alone: the logits' gradient then arrived as
zeros of the logits' size (batch x sequence x vocabulary, 823 MB for GPT-2 at 8 x 512 in
float32), allocated at the start of the backward, when the most memory is alive. With
`set_materialize_grads(False)` (runtime.py) an absent gradient stays None; this module
compiles the backward once more, on the first call with that set absent.

A loaded entry (the compiled-artifact cache, backends/warm.py) has no backward graph to
compile: `KeptZeroTangents` serves it the variants the compiling process kept as it compiled
them (`ZeroTangents.on_compiled`), and for a set that process never met, the whole backward
with zeros made for the absent tangents (what autograd would have passed).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx

from ..lazy_graphs import LazyGraphModule
from .runtime import call_compiled

TangentSpec = tuple[tuple[int, ...], torch.dtype, torch.device]  # (shape, dtype, device)

aten = torch.ops.aten


def _fixed_shape(val) -> bool:
    return isinstance(val, torch.Tensor) and all(isinstance(s, int) for s in val.shape)


class ZeroTangents:
    """Compiled backwards for absent tangents, made on first use and kept."""

    def __init__(self, bw: torch.fx.GraphModule, num_tangents: int, compiler: Callable) -> None:
        self.bw = bw
        self.compiler = compiler
        placeholders = bw.graph.find_nodes(op="placeholder")
        self.tangents = placeholders[len(placeholders) - num_tangents :]
        self.compiled: dict[tuple[int, ...], Callable] = {}
        # told of each variant compiled, (absent, compiled): the artifact cache keeps it
        self.on_compiled: Callable[[tuple[int, ...], Callable], None] | None = None

    def specs(self) -> list[TangentSpec]:
        """Each tangent's shape, dtype and device (shapes fixed: `supports`)."""
        return [(tuple(v.shape), v.dtype, v.device) for v in (t.meta["val"] for t in self.tangents)]

    def supports(self, absent: tuple[int, ...]) -> bool:
        """Are the absent tangents' shapes fixed (a zeros fill needs its size at compile time)?"""
        return all(_fixed_shape(self.tangents[k].meta.get("val")) for k in absent)

    def backward(self, absent: tuple[int, ...]) -> Callable:
        """The compiled backward in which tangents `absent` (positions among the tangents) are
        zeros; the caller leaves them out of the inputs."""
        if absent not in self.compiled:
            gm = zero_tangent_graph(self.bw, [self.tangents[k] for k in absent])
            self.compiled[absent] = self.compiler(gm, _example_inputs(gm))
            if self.on_compiled is not None:
                self.on_compiled(absent, self.compiled[absent])
        return self.compiled[absent]


class KeptZeroTangents:
    """A loaded entry's backwards for absent tangents (module doc): `load(absent)` gives the
    variant the compiling process kept, or None; then the whole backward `full`, with zeros
    of `specs` (one per tangent) made for the absent ones."""

    def __init__(
        self,
        specs: list[TangentSpec],
        full: Callable,
        load: Callable[[tuple[int, ...]], Callable | None],
    ) -> None:
        self.specs = specs
        self.full = full
        self.load = load
        self.compiled: dict[tuple[int, ...], Callable] = {}

    def backward(self, absent: tuple[int, ...]) -> Callable:
        if absent not in self.compiled:
            kept = self.load(absent)
            self.compiled[absent] = kept if kept is not None else self._with_zeros(absent)
        return self.compiled[absent]

    def _with_zeros(self, absent: tuple[int, ...]) -> Callable:
        full, specs = self.full, self.specs
        given_count = len(specs) - len(absent)

        def run(args: list):
            start = len(args) - given_count
            given = iter(args[start:])
            tangents = [
                torch.zeros(specs[j][0], dtype=specs[j][1], device=specs[j][2])
                if j in absent
                else next(given)
                for j in range(len(specs))
            ]
            full_args = [*args[:start], *tangents]
            args.clear()  # boxed: the saved values die inside the backward
            del given, tangents
            return call_compiled(full, full_args)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run


def zero_tangent_graph(bw: torch.fx.GraphModule, absent: list[torch.fx.Node]):
    """A copy of `bw` whose nodes read a zeros fill instead of each placeholder in `absent`,
    and which takes those placeholders no more."""
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    fills: list[tuple[torch.fx.Node, torch.fx.Node]] = []
    for n in bw.graph.nodes:
        env[n] = g.node_copy(n, lambda a: env[a])
        if n in absent:
            fills.append((n, env[n]))
    for old, placeholder in fills:
        val = old.meta["val"]
        with g.inserting_after(placeholder):
            zeros = g.call_function(
                aten.zeros.default,
                (list(val.shape),),
                {"dtype": val.dtype, "device": val.device, "pin_memory": False},
            )
        zeros.meta = {"val": val}
        placeholder.replace_all_uses_with(zeros)
        g.erase_node(placeholder)
    g.lint()
    return LazyGraphModule(bw, g, class_name="KilnBackward")


def _example_inputs(gm: torch.fx.GraphModule) -> list:
    return [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
