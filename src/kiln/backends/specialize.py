"""A graph with symbolic sizes for a code generator of concrete sizes: one build per size.

Takes an ATen graph whose placeholders carry symbolic values (`meta["val"]`: fake tensors with
SymInt sizes, SymInts for sizes a backward takes), which the pipeline declined or failed on,
and `attempt(gm, example_inputs) -> (compiled | None, reason)`, the pipeline for a concrete
graph. Gives a boxed callable (`SizeSpecialized`) that reads the call's sizes, and for each
size signature not seen before compiles a concrete copy of the graph: the symbolic ATen graph
traced again with fake inputs of the call's sizes (make_fx on the graph itself: a few
milliseconds, no AOT autograd again), where every size is a constant. Each specialization is
reported (`KILN_LOGS=perf_hints` and the backend's fallback record), since each is a build that
a code generator taking symbolic sizes would not need. Past `limit` specializations, or once a
concrete copy is declined too, new sizes run the symbolic graph on eager ATen kernels, loudly.

Why: until a device's code generator takes symbolic sizes (or for a device that never will),
AOT autograd still traces once for all sizes and only the last stage pays per size; what runs
is always a graph compiled for the call's own sizes or eager kernels, never one made for
other sizes.
"""

from __future__ import annotations

from typing import Any, Callable

import sympy
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from .. import logs

Attempt = Callable[[torch.fx.GraphModule, list], tuple[Callable | None, str]]
_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def has_symbolic_placeholders(gm: torch.fx.GraphModule) -> bool:
    """Whether a placeholder of `gm` carries a symbolic size (a SymInt, or a fake tensor with
    SymInt sizes or strides)."""
    return any(_symbolic(n.meta.get("val")) for n in gm.graph.find_nodes(op="placeholder"))


def _symbolic(val: Any) -> bool:
    if isinstance(val, _SYM_TYPES):
        return True
    return isinstance(val, torch.Tensor) and any(
        not isinstance(s, int) for s in (*val.shape, *val.stride())
    )


def _key_reads(vals: list) -> tuple[list[str], list[str]]:
    """(names, Python expressions over the inputs `a`) of the values that fix every symbolic
    size of the placeholders `vals`: each symbol read where it is a size or an int input (a
    size signature of a few ints, however many inputs there are), or, when a symbol appears
    only inside expressions, the shapes of the inputs with symbolic sizes."""
    where: dict[sympy.Symbol, str] = {}
    needed: set[sympy.Symbol] = set()
    plain: list[int] = []
    for i, v in enumerate(vals):  # ints first: reading one is cheaper than a size
        if isinstance(v, _SYM_TYPES):
            needed |= v.node.expr.free_symbols
            if isinstance(v.node.expr, sympy.Symbol):
                where.setdefault(v.node.expr, f"a[{i}]")
        elif not isinstance(v, torch.Tensor):
            plain.append(i)
    for i, v in enumerate(vals):
        if isinstance(v, torch.Tensor):
            for d, size in enumerate(v.shape):
                if isinstance(size, torch.SymInt):
                    needed |= size.node.expr.free_symbols
                    if isinstance(size.node.expr, sympy.Symbol):
                        where.setdefault(size.node.expr, f"a[{i}].size({d})")
    names = [f"input {i}" for i in plain]
    reads = [f"a[{i}]" for i in plain]
    if needed <= where.keys():
        ordered = sorted(needed, key=str)
        return names + [str(s) for s in ordered], reads + [where[s] for s in ordered]
    shaped = [i for i, v in enumerate(vals) if _symbolic(v) and isinstance(v, torch.Tensor)]
    return names + [f"input {i} shape" for i in shaped], reads + [f"a[{i}].shape" for i in shaped]


def _call(fn: Callable, args: list) -> Any:
    if getattr(fn, "_boxed_call", False):
        return fn(args)
    return fn(*args)


class SizeSpecialized:
    """The boxed callable `specialize_per_size` gives (see the module doc)."""

    _boxed_call = True

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        why: str,
        attempt: Attempt,
        report: Callable[[str], None],
        limit: int,
        label: str = "a graph",
    ) -> None:
        self.gm = gm
        self.why = why
        self.attempt = attempt
        self.report = report
        self.limit = limit
        self.label = label
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        vals = [p.meta.get("val") for p in placeholders]
        self.tensor_pos = [i for i, v in enumerate(vals) if isinstance(v, torch.Tensor)]
        self.all_tensors = len(self.tensor_pos) == len(vals)
        self.key_names, reads = _key_reads(vals)
        scope: dict[str, Any] = {}
        exec(f"def key(a):\n    return ({''.join(r + ', ' for r in reads)})", scope)
        self.key: Callable[[list], tuple] = scope["key"]
        self.table: dict[tuple, Callable] = {}  # size signature -> compiled concrete copy
        self.eager: Callable | None = None  # the symbolic graph on eager kernels
        self.given_up = ""  # why sizes not in the table run on eager kernels

    def __call__(self, args: list) -> Any:
        fn = self.table.get(self.key(args))
        if fn is None:
            fn = self._specialize(args)
            if fn is None:
                return self._run_eager(args)
        if self.all_tensors:
            return _call(fn, args)
        tensors = [args[i] for i in self.tensor_pos]
        args.clear()
        return _call(fn, tensors)

    def _run_eager(self, args: list) -> Any:
        if self.eager is None:
            from ..codegen import eager_callable

            self.eager = eager_callable(self.gm)
        values = list(args)
        args.clear()
        return self.eager(*values)

    def _describe(self, key: tuple) -> str:
        return ", ".join(
            f"{name}={tuple(v) if isinstance(v, torch.Size) else v}"
            for name, v in zip(self.key_names, key)
        )

    def _specialize(self, args: list) -> Callable | None:
        """A compiled copy for `args`' sizes, kept in the table; None: run eager kernels."""
        if self.given_up:
            return None
        key = self.key(args)
        sizes = self._describe(key)
        if len(self.table) >= self.limit:
            self.given_up = f"more than {self.limit} size specializations"
            logs.warn_once(
                f"kiln-specialize-limit-{id(self)}",
                f"{self.label}: a graph with symbolic sizes was compiled for {self.limit} sizes "
                f"(the code generator declined symbolic sizes: {self.why}); from now on new "
                f"sizes ({sizes}) run on eager ATen kernels",
            )
            self.report(f"{self.given_up}: new sizes ({sizes} first) run on eager kernels")
            return None
        try:
            concrete = concrete_copy(self.gm, args)
        except Exception as e:  # noqa: BLE001 - eager kernels are always right
            self.given_up = f"the graph could not be traced for sizes {sizes}: {e!r}"
            self.report(self.given_up)
            return None
        examples = [n.meta.get("val") for n in concrete.graph.find_nodes(op="placeholder")]
        compiled, reason = self.attempt(concrete, examples)
        if compiled is None:
            self.given_up = f"a copy for sizes {sizes} was declined too: {reason}"
            self.report(self.given_up)
            return None
        self.table[key] = compiled
        self.report(
            f"compiled for sizes {sizes} (specialization {len(self.table)} of at most "
            f"{self.limit}; symbolic sizes declined: {self.why})"
        )
        return compiled


def concrete_copy(gm: torch.fx.GraphModule, args: list) -> torch.fx.GraphModule:
    """`gm` traced again with fake inputs of `args`' sizes: every size is a constant. The copy
    takes the tensor inputs only (ints are baked in)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=_shape_env_for(gm))
    tensor_pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    fakes = [mode.from_tensor(args[i], static_shapes=True) for i in tensor_pos]
    values = list(args)

    def run(*tensors: torch.Tensor) -> Any:
        full = list(values)
        for i, t in zip(tensor_pos, tensors):
            full[i] = t
        return torch.fx.Interpreter(gm).run(*full)

    with mode:
        return make_fx(run)(*fakes)


def _shape_env_for(gm: torch.fx.GraphModule) -> ShapeEnv | None:
    """A shape environment for a graph whose fake run makes sizes of its own even at constant
    input sizes: a control-flow operator (while_loop's fake kernel makes its carried sizes
    symbols of one) or a tensor read as a number (a while_loop's backward indexes its saved
    iterations by one); None for any other graph (no symbols can appear)."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and (
            isinstance(n.target, torch._ops.HigherOrderOperator)
            or n.target is torch.ops.aten._local_scalar_dense.default
        ):
            return ShapeEnv()
    return None


def specialize_per_size(
    gm: torch.fx.GraphModule,
    why: str,
    attempt: Attempt,
    report: Callable[[str], None],
    limit: int,
    label: str = "a graph",
) -> SizeSpecialized:
    """The symbolic graph `gm`, declined for `why`, compiled per size signature (module doc)."""
    return SizeSpecialized(gm, why, attempt, report, limit, label)
