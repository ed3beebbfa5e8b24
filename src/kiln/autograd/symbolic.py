"""Symbolic sizes in AOT autograd: the fake world a graph is traced in, and sizes read at run time.

Takes a captured graph whose placeholders carry capture's fake tensors with symbolic sizes
(`meta["example_value"]`, fake tensors of capture's `FakeTensorMode` and its `ShapeEnv`); gives

- `FakeWorld`: the fake mode a trace runs in and the fake inputs it traces with. A static
  world is a fresh `FakeTensorMode` and fakes of the call's real tensors (concrete sizes); a
  symbolic world is capture's own mode, and each input's fake has capture's symbols, so one
  trace serves every size (the sizes first seen are the hints that decide what the trace
  needs to know, and what it needs becomes a guard of the shape environment).
- `hint`: a size's value at the sizes first seen.

Sizes read at run time (`SizeReader`, the shape guards AOT tracing added) are in sizes.py,
which imports sympy: only a graph with symbolic sizes loads it (sympy's import is ~0.3 s of a
warm start's first call otherwise).

Why: AOT autograd traces once for all sizes; what the trace relied on that capture had not
already checked must be checked on every call, or a size that breaks it would get a graph that
was made for another (a wrong result, not a slow one).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

if TYPE_CHECKING:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_symbolic(value: Any) -> bool:
    """A SymInt/SymFloat/SymBool whose value depends on a symbol (not a constant)."""
    return isinstance(value, _SYM_TYPES) and bool(value.node.expr.free_symbols)


def tensor_is_symbolic(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and any(
        not isinstance(s, int) for s in (*t.shape, *t.stride(), t.storage_offset())
    )


def _example(node: torch.fx.Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


class FakeWorld:
    """The fake mode of one trace and the fake inputs it takes (see the module doc)."""

    def __init__(self, mode: FakeTensorMode, examples: list | None = None) -> None:
        self.mode = mode
        self.examples = examples  # per input: capture's fake (symbolic world) or None
        self.symbolic = examples is not None

    @classmethod
    def static(cls, shape_env: bool = False) -> "FakeWorld":
        """Fakes of the call's own sizes; `shape_env`: with a shape environment all the same,
        for ops whose fake kernels make sizes of their own (`needs_shape_env`)."""
        if not shape_env:
            return cls(FakeTensorMode())
        from torch.fx.experimental.symbolic_shapes import ShapeEnv  # (imports sympy)

        return cls(FakeTensorMode(shape_env=ShapeEnv()))

    @property
    def shape_env(self) -> ShapeEnv | None:
        return self.mode.shape_env

    def _fake(self, i: int, x: torch.Tensor) -> torch.Tensor:
        ev = self.examples[i] if self.examples is not None else None
        if isinstance(ev, FakeTensor) and ev.fake_mode is self.mode:
            # capture's fake: its sizes, strides and offset are the symbols (or the constants)
            # every later call is checked against; a detached alias is a fresh leaf
            return ev.detach()
        return self.mode.from_tensor(x.detach(), static_shapes=True)

    def tensor_fakes(self, inputs: list) -> list:
        """Detached fakes of the tensor inputs (traced graphs take tensors only)."""
        if not self.symbolic:
            return [
                self.mode.from_tensor(x.detach()) for x in inputs if isinstance(x, torch.Tensor)
            ]
        return [self._fake(i, x) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]

    def input_fakes(self, inputs: list) -> list:
        """Fakes of every input (non-tensors as they are) with the call's requires_grad and
        leaf-ness: what a fake run of the captured graph takes (analyze.py)."""
        if not self.symbolic:
            return [self.mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs]
        out = []
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                out.append(x)
                continue
            f = self._fake(i, x)
            if x.requires_grad:
                f.requires_grad_(True)
                if x.grad_fn is not None:  # a non-leaf input stays one (in-place ops on it
                    with self.mode, torch.enable_grad():  # are recorded, not refused)
                        f = f.clone()
            out.append(f)
        return out


def symbolic_world(gm: torch.fx.GraphModule) -> FakeWorld | None:
    """Capture's fake world, if `gm`'s placeholders carry fake tensors with symbolic sizes (or
    symbolic ints) of one shape environment; else None (the graph is traced per call's sizes)."""
    examples = [_example(n) for n in gm.graph.find_nodes(op="placeholder")]
    mode = None
    for ev in examples:
        if isinstance(ev, FakeTensor) and tensor_is_symbolic(ev) and ev.fake_mode.shape_env:
            mode = ev.fake_mode
            break
    if mode is None:
        return None
    return FakeWorld(mode, examples)


def needs_shape_env(gm: torch.fx.GraphModule) -> bool:
    """Whether tracing `gm` needs a shape environment even at static sizes: torch's fake
    `while_loop` gives its carried sizes as (unbacked) symbols of one, and has none to use
    without it."""
    return any(n.op == "call_function" and n.target in _SHAPE_ENV_OPS for n in gm.graph.nodes)


_SHAPE_ENV_OPS = tuple(
    op for op in (getattr(torch.ops.higher_order, "while_loop", None),) if op is not None
)


def compile_function(source: str, name: str) -> Callable:
    """The function `name` that `source` (generated Python over a call's inputs `a`, sizes.py)
    defines; it keeps `source` (`fn.source`): the compiled-artifact cache stores that text and
    compiles it again in a later process without sympy (backends/warm.py)."""
    scope: dict[str, Any] = {"max": max, "min": min, "abs": abs, "math": math}
    exec(compile(source, f"<kiln aot {name}>", "exec"), scope)
    fn = scope[name]
    fn.source = source
    return fn


UNBACKED_HINT = 8192  # the size assumed for a size no input holds (it is only a weight)


def hint(value: Any) -> int:
    """A size's value at the sizes first seen (the shape environment's hint)."""
    if isinstance(value, torch.SymInt):
        node = value.node
        known = node.hint if node.has_hint() else None
        if known is None:  # an expression over symbols that have hints, or an unbacked size
            # (a while_loop's iteration count): a guess, which only weighs costs
            known = node.shape_env.optimization_hint(node.expr, fallback=UNBACKED_HINT)
        return int(known)
    return int(value)
