"""Lower a functional ATen FX graph to a `LoopGraph`.

Takes a `torch.fx.GraphModule` whose call nodes target `torch.ops.aten` overloads (what
`make_fx` gives, after the device's ATen rewrites), its example inputs and the device's
`Capabilities`; gives a `LoopGraph`: one `Input` per placeholder, a `Constant` per tensor
attribute, and the nodes each lowering added. Only layouts are read (sizes, strides, dtypes,
devices), so the inputs may live on any device. An op with no lowering, with a dtype the
device's kernels lack, with an output off the graph's device, or whose lowering declines
(`Unsupported`), becomes an `Extern` — always correct, never fused — and is counted under
`KILN_LOGS=perf_hints`.

Why it exists: this is the one walk over the FX graph; everything after it sees only loop IR.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Sequence
from typing import Any, TypeGuard

import sympy
import torch

from .. import logs, trace
from ..devices import Capabilities, accelerator_of
from ..rewrites.meta import ensure_meta
from .context import LoweringContext
from .indexing import ReshapeUnsupported
from .ir import (
    BufRef,
    Constant,
    Extern,
    ExternItem,
    Input,
    Layout,
    LoopGraph,
    buf_refs,
    node_dtype,
)
from .layouts import store_in_eager_order
from .registry import Unsupported, lowering_for
from .subgraphs import REASON as SUBGRAPH_REASON
from .subgraphs import SubgraphCall
from .symbolic import (
    SymbolicUnsupported,
    from_torch,
    graph_hints,
    sizes_of,
    using_hints,
)

# Extern calls seen by this process, by op and reason (benchmarks and the OpInfo sweep read it).
EXTERN_COUNTS: collections.Counter = collections.Counter()


class GraphUnsupported(Exception):
    """The whole graph cannot be compiled (the caller runs it eagerly); says why."""


# What `lower_graph` assumes when no device's capabilities are given (tests, tools): every loop
# dtype and indirect loads, as the cpu device has.
DEFAULT_CAPABILITIES = Capabilities(indirect_loads=True)


def _layout(t: torch.Tensor) -> Layout:
    """A tensor's layout; symbolic sizes and strides as expressions (lower/symbolic.py)."""
    try:
        size, stride, offset = sizes_of(t)
    except SymbolicUnsupported as e:
        raise GraphUnsupported(str(e)) from None
    return Layout(size, stride, t.dtype, offset)


def _sym_value(val: object) -> object:
    """The kiln value of an FX node that computes an integer (a size, `sym_size`, arithmetic on
    sizes), or `_NOT_SYM` when `val` is not one."""
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        try:
            return from_torch(val)
        except SymbolicUnsupported as e:
            raise GraphUnsupported(str(e)) from None
    return _NOT_SYM


_NOT_SYM = object()


# What each FX node lowered to: a BufRef, a tuple of them (None for non-tensor outputs), or the
# Python value a lowering gave.
Env = dict[torch.fx.Node, Any]


def _map_args(value: object, env: Env) -> Any:
    """`value` (an FX argument) with its graph nodes replaced by what they lowered to."""
    if isinstance(value, torch.fx.Node):
        return env[value]
    if isinstance(value, (list, tuple)):
        return (
            type(value)(_map_args(v, env) for v in value)
            if isinstance(value, list)
            else tuple(_map_args(v, env) for v in value)
        )
    return value


def _why_extern(
    ctx: LoweringContext, target: object, args: tuple, kwargs: dict[str, Any], val: object
) -> str | None:
    """None if `target` may be lowered here, else the reason it is an extern call."""
    if not isinstance(target, torch._ops.OpOverload):
        return f"{target} is not an ATen op"
    if lowering_for(target) is None:
        return "no lowering"
    outs = val if isinstance(val, (tuple, list)) else (val,)
    for o in outs:
        if o is not None and not isinstance(o, torch.Tensor):
            return "returns a non-tensor value"
        if isinstance(o, torch.Tensor) and o.dtype not in ctx.dtypes:
            return f"output dtype {o.dtype} has no kernel on this device"
        if isinstance(o, torch.Tensor) and not ctx.on_graph_device(o.device):
            # kernels write buffers the wrapper allocates on the graph's device
            return f"output on {o.device}, not the graph's device {ctx.device}"
    for ref in buf_refs((args, tuple(kwargs.values()))):
        node = ctx.nodes[ref.name]
        if isinstance(node, (Extern,)) and node.layouts[0] is None:
            return "an argument is a value only known at run time"
        dtype = node_dtype(node)
        if dtype not in ctx.dtypes:
            return f"input dtype {dtype} has no kernel on this device"
    return None


def _extern(
    ctx: LoweringContext,
    target: object,
    args: tuple,
    kwargs: dict[str, Any],
    val: object,
    reason: str,
) -> BufRef | tuple[BufRef | None, ...]:
    multi = isinstance(val, (tuple, list))
    outs = val if isinstance(val, (tuple, list)) else (val,)
    layouts = tuple(_layout(o) if isinstance(o, torch.Tensor) else None for o in outs)
    name = ctx.fresh("extern")
    node = Extern(name, target, tuple(args), tuple(sorted(kwargs.items())), layouts, multi, reason)
    ctx.add(node)
    EXTERN_COUNTS[(str(target), reason)] += 1
    logs.log("perf_hints", lambda: f"extern call {target}: {reason}")
    # One name a tensor output (None for the others); a tensor output always has a layout.
    names = [name] if not multi else [ctx.fresh("buf") if lay else None for lay in layouts]
    for item, out in zip(names, outs):
        if item is not None and isinstance(out, torch.Tensor):
            if not ctx.on_graph_device(out.device):
                ctx.elsewhere[item] = out.device  # no kernel may read it (LoweringContext.load)
    if not multi:
        return BufRef(name)
    return tuple(
        ctx.add(ExternItem(item, name, k, lay)) if item is not None and lay is not None else None
        for k, (item, lay) in enumerate(zip(names, layouts))
    )


def graph_device(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> torch.device:
    """The device a graph's tensors live on (`devices.accelerator_of`: placeholders' fake
    values first, then the example inputs), else the CPU."""
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    return accelerator_of(vals + list(example_inputs)) or torch.device("cpu")


@trace.timed("lower")
def lower_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[object],
    capabilities: Capabilities | None = None,
) -> LoopGraph:
    """The loop IR of `gm` (module doc) for a device with `capabilities`."""
    ensure_meta(gm, example_inputs)
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    hints = graph_hints(vals)
    with using_hints(hints):
        return _lower(gm, example_inputs, capabilities, hints)


def _lower(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[object],
    capabilities: Capabilities | None,
    hints: dict,
) -> LoopGraph:
    caps = capabilities if capabilities is not None else DEFAULT_CAPABILITIES
    device = graph_device(gm, example_inputs)
    ctx = LoweringContext(device=device, indirect_loads=caps.indirect_loads, dtypes=caps.dtypes)
    ctx.symbolic = bool(hints)
    env: Env = {}
    inputs: list[str] = []
    constants: dict[str, torch.Tensor] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise GraphUnsupported("graph placeholders and example inputs differ in number")
    outputs: tuple = ()
    signature: list[str] = []
    scalars: dict[str, object] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            example = example_inputs[len(signature)]
            name = f"arg{len(signature)}"
            signature.append(name)
            # A symbolic graph's placeholders carry fake values with symbolic sizes; the
            # example inputs may be real tensors of one size.
            fake = node.meta.get("val")
            sym = _sym_value(fake)
            if sym is _NOT_SYM:  # no fake value: the example itself may be a SymInt
                sym = _sym_value(example)
            if sym is not _NOT_SYM or (isinstance(example, int) and not isinstance(example, bool)):
                value = sym if sym is not _NOT_SYM else example
                env[node] = scalars[name] = value
                continue
            if not isinstance(example, torch.Tensor):
                raise GraphUnsupported(f"input {node.name} is not a tensor")
            shown = fake if isinstance(fake, torch.Tensor) and hints else example
            env[node] = ctx.add(Input(name, _layout(shown)))
            inputs.append(name)
        elif node.op == "get_attr":
            tensor = getattr(gm, node.target)
            if isinstance(tensor, torch.fx.GraphModule):
                env[node] = tensor  # a control-flow operator's branch (subgraphs.py)
                continue
            if not isinstance(tensor, torch.Tensor):
                raise GraphUnsupported(f"attribute {node.target} is not a tensor")
            name = ctx.fresh("const")
            constants[name] = tensor
            env[node] = ctx.add(Constant(name, _layout(tensor)))
        elif node.op == "call_function" and node.target is operator.getitem:
            base, idx = node.args
            env[node] = env[base][idx]
        elif node.op == "call_function" and _sym_value(node.meta.get("val")) is not _NOT_SYM:
            # sizes and arithmetic on them (`sym_size`, `s0 * s1`): their value as an expression
            env[node] = _sym_value(node.meta.get("val"))
        elif node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            call = SubgraphCall(node.target, _map_args(node.args, env))
            val = node.meta.get("val")
            env[node] = _extern(ctx, call, call.tensor_args(), {}, val, SUBGRAPH_REASON)
        elif node.op == "call_function":
            schema = getattr(node.target, "_schema", None)
            if schema is not None and schema.is_mutable:
                raise GraphUnsupported(
                    f"{node.target} mutates a tensor in place; codegen takes functional graphs "
                    "(functionalize the graph first, as kiln's AOT autograd does)"
                )
            args = _map_args(node.args, env)
            kwargs = {k: _map_args(v, env) for k, v in node.kwargs.items()}
            val = node.meta.get("val")
            env[node] = _lower_node(ctx, node.target, args, kwargs, val)
        elif node.op == "output":
            outputs = tuple(_output(v, env) for v in _flat_outputs(node.args[0]))
        else:
            raise GraphUnsupported(f"FX node kind {node.op!r} ({node.target}) in an ATen graph")
    if scalars:
        missing = [n for n, v in scalars.items() if not isinstance(v, (int, sympy.Basic))]
        if missing:
            raise GraphUnsupported(f"inputs {', '.join(missing)} are not integers or sizes")
    return LoopGraph(
        tuple(ctx.nodes.values()),
        tuple(inputs),
        outputs,
        constants,
        scalars,
        tuple(signature) if scalars else (),
        hints,
    )


def _flat_outputs(out: object) -> list[Any]:
    """The graph's outputs, flattened (the contract is a flat tuple; nested ones are flattened)."""
    import torch.utils._pytree as pytree

    return pytree.tree_leaves(out, is_leaf=lambda v: v is None)


def _output(value: object, env: Env) -> str | int | float | bool | None:
    if isinstance(value, torch.fx.Node):
        ref = env[value]
        if isinstance(ref, (int, sympy.Basic)):  # a size the graph returns
            return ref
        if not isinstance(ref, BufRef):
            raise GraphUnsupported(f"output {value.name} is not a single tensor")
        return ref.name
    if value is None or isinstance(value, (int, float, bool)):
        return value
    raise GraphUnsupported(f"output of type {type(value).__name__}")


def _lower_node(
    ctx: LoweringContext, target: object, args: tuple, kwargs: dict[str, Any], val: object
) -> object:
    reason = _why_extern(ctx, target, args, kwargs, val)
    if reason is None:
        # _why_extern checked these: an ATen op with a lowering, tensor (or None) outputs
        assert isinstance(target, torch._ops.OpOverload)
        assert val is None or isinstance(val, (torch.Tensor, tuple, list))
        lowering = lowering_for(target)
        assert lowering is not None
        ctx.out, ctx.op = val, target
        checkpoint = dict(ctx.nodes)
        try:
            return store_in_eager_order(ctx, lowering(ctx, *args, **kwargs), val)
        except (Unsupported, ReshapeUnsupported, SymbolicUnsupported) as e:
            ctx.nodes = checkpoint
            reason = f"lowering declined: {e}"
        except TypeError as e:
            # A lowering that compared a symbolic size as a number (sympy cannot say whether
            # `s0 < 4`): kept as an ATen call, which is right for every size.
            if not ctx.symbolic:
                raise
            ctx.nodes = checkpoint
            reason = f"lowering needs static sizes here ({e})"
    return _extern(ctx, target, args, kwargs, val, reason)


def extern_summary(graph: LoopGraph) -> str:
    """The graph's extern calls that stand for ATen ops kiln did not lower (bounds checks,
    which kiln adds itself, are not fallbacks and are left out)."""
    counts = collections.Counter(f"{n.target} ({n.reason})" for n in graph.nodes if is_fallback(n))
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(counts.items()))


def is_fallback(node: object) -> TypeGuard[Extern]:
    """An `Extern` standing for an ATen op kept as is (not one of kiln's own checks)."""
    return isinstance(node, Extern) and not is_check(node)


def is_check(node: object) -> bool:
    return isinstance(node, Extern) and str(node.target).startswith("kiln.")
