"""Lower a functional ATen FX graph to a `LoopGraph`.

Takes a `torch.fx.GraphModule` whose call nodes target `torch.ops.aten` overloads (what
`make_fx` gives) and its example inputs; gives a `LoopGraph`: one `Input` per placeholder, a
`Constant` per tensor attribute, and the nodes each lowering added; a call that repeats an
earlier one (cse.py) is lowered once and named twice. An op with no lowering, with a dtype the
C++ renderer lacks, with an output off the graph's device, or whose lowering declines
(`Unsupported`), becomes an `Extern` — always correct, never fused — and is counted under
`KILN_LOGS=perf_hints`.

Why it exists: this is the one walk over the FX graph; everything after it sees only loop IR.
"""

from __future__ import annotations

import collections
import operator

import torch

from .. import logs, trace
from .context import INDIRECT_LOAD_DEVICES, SUPPORTED_DTYPES, LoweringContext
from .conv_layout import channels_last_convolutions
from .cse import common_subexpressions
from .ir import BufRef, Constant, Extern, ExternItem, Input, Layout, LoopGraph, buf_refs
from .layouts import store_in_eager_order
from .registry import Unsupported, lowering_for

# Extern calls seen by this process, by op and reason (benchmarks and the OpInfo sweep read it).
EXTERN_COUNTS: collections.Counter = collections.Counter()


class GraphUnsupported(Exception):
    """The whole graph cannot go through the C++ path (caller runs it eagerly); says why."""


def _layout(t: torch.Tensor) -> Layout:
    for s in tuple(t.shape) + tuple(t.stride()):
        if not isinstance(s, int):
            raise GraphUnsupported("symbolic (dynamic) sizes are not supported by codegen yet")
    return Layout(tuple(t.shape), tuple(t.stride()), t.dtype, int(t.storage_offset()))


def ensure_meta(gm: torch.fx.GraphModule, example_inputs) -> None:
    """Every node's `val` (fake output), propagated from `example_inputs` if any is missing. A
    node whose result is not a tensor (an assertion returning None) gets `val = None`, so a
    second call finds nothing missing and does not propagate again (codegen/triton propagates
    on the real device first, then lowers on CPU stand-ins, where device arguments such as
    `arange(..., device="cuda")` would mix)."""
    nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "placeholder")]
    if any("val" not in n.meta for n in nodes):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*example_inputs)
    for n in nodes:
        n.meta.setdefault("val", None)


def _map_args(value, env):
    if isinstance(value, torch.fx.Node):
        return env[value]
    if isinstance(value, (list, tuple)):
        return (
            type(value)(_map_args(v, env) for v in value)
            if isinstance(value, list)
            else tuple(_map_args(v, env) for v in value)
        )
    return value


def _why_extern(ctx: LoweringContext, target, args, kwargs, val) -> str | None:
    """None if `target` may be lowered here, else the reason it is an extern call."""
    if not isinstance(target, torch._ops.OpOverload):
        return f"{target} is not an ATen op"
    if lowering_for(target) is None:
        return "no lowering"
    outs = val if isinstance(val, (tuple, list)) else (val,)
    for o in outs:
        if o is not None and not isinstance(o, torch.Tensor):
            return "returns a non-tensor value"
        if isinstance(o, torch.Tensor) and o.dtype not in SUPPORTED_DTYPES:
            return f"output dtype {o.dtype} has no C++ lowering"
        if isinstance(o, torch.Tensor) and not ctx.on_graph_device(o.device):
            # kernels write buffers the wrapper allocates on the graph's device
            return f"output on {o.device}, not the graph's device {ctx.device}"
    for ref in buf_refs((args, tuple(kwargs.values()))):
        node = ctx.nodes[ref.name]
        if isinstance(node, (Extern,)) and node.layouts[0] is None:
            return "an argument is a value only known at run time"
        dtype = getattr(node, "dtype", None) or node.layout.dtype
        if dtype not in SUPPORTED_DTYPES:
            return f"input dtype {dtype} has no C++ lowering"
    return None


def _extern(ctx: LoweringContext, target, args, kwargs, val, reason: str):
    multi = isinstance(val, (tuple, list))
    outs = val if multi else (val,)
    layouts = tuple(_layout(o) if isinstance(o, torch.Tensor) else None for o in outs)
    name = ctx.fresh("extern")
    node = Extern(name, target, tuple(args), tuple(sorted(kwargs.items())), layouts, multi, reason)
    ctx.add(node)
    EXTERN_COUNTS[(str(target), reason)] += 1
    logs.log("perf_hints", lambda: f"extern call {target}: {reason}")
    names = [name] if not multi else [ctx.fresh("buf") if lay else None for lay in layouts]
    for item, out in zip(names, outs):
        if isinstance(out, torch.Tensor) and not ctx.on_graph_device(out.device):
            ctx.elsewhere[item] = out.device  # no kernel may read it (LoweringContext.load)
    if not multi:
        return BufRef(name)
    return tuple(
        ctx.add(ExternItem(item, name, k, lay)) if lay else None
        for k, (item, lay) in enumerate(zip(names, layouts))
    )


def graph_device(gm: torch.fx.GraphModule, example_inputs) -> torch.device:
    """The device a graph's tensors live on. Placeholders' `val` first: a GPU graph reaches
    lower/ with CPU stand-ins for its inputs (codegen/triton), but its metadata is the GPU's."""
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    for t in vals + list(example_inputs):
        if isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "meta"):
            return t.device
    return torch.device("cpu")


def graph_device_type(gm: torch.fx.GraphModule, example_inputs) -> str:
    return graph_device(gm, example_inputs).type


@trace.timed("lower")
def lower_graph(
    gm: torch.fx.GraphModule, example_inputs, *, indirect_loads: bool | None = None
) -> LoopGraph:
    """`indirect_loads`: may gather/embedding/index lower to loads at indices read from memory
    (the target renderer must support `Indirect`); None decides by the graph's device
    (`INDIRECT_LOAD_DEVICES`)."""
    ensure_meta(gm, example_inputs)
    device = graph_device(gm, example_inputs)
    if device.type == "cpu":
        channels_last_convolutions(gm, example_inputs)
    if indirect_loads is None:
        indirect_loads = device.type in INDIRECT_LOAD_DEVICES
    repeats = common_subexpressions(gm.graph)
    ctx = LoweringContext(device=device, indirect_loads=indirect_loads)
    env: dict[torch.fx.Node, object] = {}
    inputs: list[str] = []
    constants: dict[str, torch.Tensor] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise GraphUnsupported("graph placeholders and example inputs differ in number")
    outputs: tuple = ()
    for node in gm.graph.nodes:
        if node in repeats:
            env[node] = env[repeats[node]]
        elif node.op == "placeholder":
            example = example_inputs[len(inputs)]
            if not isinstance(example, torch.Tensor):
                raise GraphUnsupported(f"input {node.name} is not a tensor")
            if example.device.type != "cpu":
                raise GraphUnsupported(f"input {node.name} is on {example.device}, not the CPU")
            name = f"arg{len(inputs)}"
            env[node] = ctx.add(Input(name, _layout(example)))
            inputs.append(name)
        elif node.op == "get_attr":
            tensor = getattr(gm, node.target)
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
                raise GraphUnsupported(f"attribute {node.target} is not a CPU tensor")
            name = ctx.fresh("const")
            constants[name] = tensor
            env[node] = ctx.add(Constant(name, _layout(tensor)))
        elif node.op == "call_function" and node.target is operator.getitem:
            base, idx = node.args
            env[node] = env[base][idx]
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
    graph = LoopGraph(tuple(ctx.nodes.values()), tuple(inputs), outputs, constants)
    return graph


def _flat_outputs(out):
    """The graph's outputs, flattened (the contract is a flat tuple; nested ones are flattened)."""
    import torch.utils._pytree as pytree

    return pytree.tree_leaves(out, is_leaf=lambda v: v is None)


def _output(value, env):
    if isinstance(value, torch.fx.Node):
        ref = env[value]
        if not isinstance(ref, BufRef):
            raise GraphUnsupported(f"output {value.name} is not a single tensor")
        return ref.name
    if value is None or isinstance(value, (int, float, bool)):
        return value
    raise GraphUnsupported(f"output of type {type(value).__name__}")


def _lower_node(ctx: LoweringContext, target, args, kwargs, val):
    reason = _why_extern(ctx, target, args, kwargs, val)
    if reason is None:
        ctx.out, ctx.op = val, target
        checkpoint = dict(ctx.nodes)
        try:
            return store_in_eager_order(ctx, lowering_for(target)(ctx, *args, **kwargs), val)
        except Unsupported as e:
            ctx.nodes = checkpoint
            reason = f"lowering declined: {e}"
    return _extern(ctx, target, args, kwargs, val, reason)


def extern_summary(graph: LoopGraph) -> str:
    """The graph's extern calls that stand for ATen ops kiln did not lower (bounds checks,
    which kiln adds itself, are not fallbacks and are left out)."""
    counts = collections.Counter(f"{n.target} ({n.reason})" for n in graph.nodes if is_fallback(n))
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(counts.items()))


def is_fallback(node) -> bool:
    """An `Extern` standing for an ATen op kept as is (not one of kiln's own checks)."""
    return isinstance(node, Extern) and not is_check(node)


def is_check(node) -> bool:
    return isinstance(node, Extern) and str(node.target).startswith("kiln.")
