"""Split a joint forward/backward graph into a forward graph and a backward graph.

Takes a `Joint` (tracing.py): placeholders `primals_*`, `tangents_*`; outputs the forward's
outputs then the input gradients. Gives a `Partition`: a forward `GraphModule` (primals ->
forward outputs + saved values), a backward `GraphModule` (saved values + tangents -> the
gradients that are not structurally zero), and what was saved, recomputed and dropped.

Two strategies:
- `"min_cut"` (the default): mincut.py picks the cheapest set of values to save; cheap ops
  (pointwise math, views, constants: `is_recomputable`) that the backward needs are recomputed
  there instead of being kept alive from the forward. Expensive ops (matmul, convolution,
  reductions, anything unknown) always run in the forward, and random ops never run twice, so
  the backward sees exactly the dropout mask the forward used.
  Nodes of an activation-checkpointed region (`must_recompute`) are never saved, whatever
  they cost: the backward runs the region again from the values that enter it.
- `"save_all"`: save every forward value the backward reads, as eager autograd does; kept for
  comparison (benchmarks/aot_partition.py) and as the fallback when no finite cut exists.

Sizes (nodes whose value is a SymInt: `sym_size`, arithmetic on sizes) take no part in the
cut: the backward gets each size it reads as an int the forward returns (`saved_sizes`),
which costs nothing to keep, so a saved tensor never stands in for the size of another.

A gradient that does not depend on any tangent is zero (gradients are linear in the tangents):
such an input gets `None`, as in eager, where an unused parameter's `.grad` stays `None`.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx

from ..lazy_graphs import LazyGraphModule
from . import mincut
from .symbolic import hint
from .tracing import Joint

aten = torch.ops.aten

# Not pointwise-tagged, not views, yet as cheap to recompute as a fill or a copy.
_CHEAP_PACKETS = {
    aten.full,
    aten.full_like,
    aten.fill,  # (functional fill of an empty_like: reads nothing of its input)
    aten.zeros,
    aten.zeros_like,
    aten.ones,
    aten.ones_like,
    aten.empty,
    aten.empty_like,
    aten.new_zeros,
    aten.new_ones,
    aten.new_full,
    aten.new_empty,
    aten.scalar_tensor,
    aten.arange,
    aten.clone,
    aten._to_copy,
    aten.lift_fresh_copy,
    aten.where,
}
# A copy of a base with a constant written at some places: as cheap as a fill, and the same
# whichever write lands last. The cross-entropy backward's one-hot of the targets
# (`nll_loss_backward` decomposed: zeros + scatter of -1) is one; computed in the forward, as it
# reads no tangent, and saved, it kept a logits-sized tensor alive from the forward to the
# backward. (`scatter` with a tensor `src` is not: with repeated indices the value that lands
# last may differ from run to run on a GPU.)
_CHEAP_OVERLOADS = {aten.scatter.value, aten.index_fill.int_Scalar}


def _is_view_op(op: torch._ops.OpOverload) -> bool:
    if hasattr(op, "is_view"):
        return bool(op.is_view)
    returns = op._schema.returns  # older torch: read the alias annotation of the result
    return (
        bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write
    )


def _is_view(node: torch.fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and _is_view_op(node.target)


def is_random(node: torch.fx.Node) -> bool:
    """Does `node` draw random numbers? Fused attention is tagged as seeded for its dropout,
    but with `dropout_p=0` (every model in eval, HF's Llama in training) it draws none and may
    run again in the backward."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    return _argument(node, "dropout_p", None) not in (0, 0.0)


def _argument(node: torch.fx.Node, name: str, default):
    """The value `node` passes for its op's argument `name` (`default` when it has none)."""
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.name == name:
            if name in node.kwargs:
                return node.kwargs[name]
            if i < len(node.args):
                return node.args[i]
            return arg.default_value if arg.has_default_value() else default
    return default


def is_recomputable(node: torch.fx.Node) -> bool:
    """May this forward node run again in the backward? Cheap and deterministic ops only."""
    if node.op == "get_attr":  # a constant of the joint graph: fetched again, never saved
        return True
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload) or is_random(node):
        return False
    return (
        torch.Tag.pointwise in target.tags
        or _is_view_op(target)
        or target.overloadpacket in _CHEAP_PACKETS
        or target in _CHEAP_OVERLOADS
    )


def must_recompute(node: torch.fx.Node) -> bool:
    """A node of an activation-checkpointed region (capture/checkpoint.py marks them; make_fx
    copies the mark onto the ATen nodes it traces from them): its value is not saved for the
    backward but computed again there, whatever it costs. Random ops are the exception: their
    values are saved, so the backward sees the forward's (eager replays the RNG state)."""
    if not node.meta.get("recompute") or node.op != "call_function" or is_random(node):
        return False
    # an item of a random op's tuple result (dropout's mask) is saved like the op's tensor
    return not (node.target is operator.getitem and is_random(node.args[0]))


def _leaves_region(node: torch.fx.Node, forward: set) -> bool:
    """Is `node` a checkpointed region's output: read, on the way to the forward's outputs
    (`forward`: their ancestors), by a node outside its region (the next region's input, the
    final norm)? Eager saves a checkpoint's inputs; recomputing them too would rebuild every
    layer from the first one in the backward, all alive at once (HF Llama's checkpointed step
    peaked as high as the plain one). Nodes autograd made for the backward only do not count."""
    if node.meta.get("ac_graph_id") is None:
        return False  # marks without region numbers (an older trace): every mark recomputed
    region = node.meta["ac_graph_id"]
    for user in node.users:
        if user.op == "output":
            return True
        if user in forward and user.meta.get("ac_graph_id") != region:
            return True
    return False


def value_bytes(node: torch.fx.Node) -> int:
    """Memory that saving `node` keeps alive (at the sizes first seen, for symbolic sizes);
    `INF` for values that cannot be saved."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return mincut.INF
    dense = hint(val.numel()) * val.element_size()
    try:
        return min(dense, hint(val.untyped_storage().nbytes()))
    except (NotImplementedError, RuntimeError):
        return dense


def is_size(node: torch.fx.Node) -> bool:
    """A node computing a size (a SymInt, SymFloat or SymBool), not a tensor."""
    return node.op == "call_function" and isinstance(node.meta.get("val"), _SYM_TYPES)


_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


@dataclass
class Partition:
    fw: torch.fx.GraphModule
    bw: torch.fx.GraphModule
    num_fw_outputs: int
    saved: list[str]
    saved_bytes: int
    recomputed: list[str]
    grad_present: list[bool]  # per differentiable input: does the backward return a gradient?
    strategy: str
    notes: list[str] = field(default_factory=list)
    saved_sizes: list[str] = field(default_factory=list)  # ints the forward returns last


# Reads at indices loaded from memory, which the code generator lowers as loads in the reading
# kernel (lower/indirect.py): their results need not be in memory. `gather` also counts as a
# fusing reader: the cross-entropy's gather of log-probabilities at the targets reads the
# logits and two row statistics. Embedding's readers do not (counted so, the position ids it
# reads were computed again in the backward for its extern `embedding_dense_backward`: a
# kernel more, where the forward wrote them from a kernel it runs anyway).
_GATHERS = {aten.gather, aten.index, aten.index_select, aten.take, aten.embedding}
_FUSING_READERS = {aten.gather}


def _fusible(node: torch.fx.Node) -> bool:
    """Can a kernel compute `node` from its inputs' elements in registers (a pointwise op, a
    view, a reduction, a gather), rather than an extern call (matmul, convolution) reading them
    from memory?"""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return target is operator.getitem
    return (
        is_recomputable(node)
        or torch.Tag.reduction in target.tags
        or target.overloadpacket in _FUSING_READERS
    )


def _writes(n: torch.fx.Node, forward: set, fw_outs: set) -> tuple[bool, bool]:
    """(does the forward write `n` to memory, would the backward have to, were it recomputed
    there): a pass writes a value that it returns or that an op which cannot fuse reads
    (through views). The forward also writes a value that two of its ops read (different
    kernels, as a rule: a residual stream's running sum), unless it is a cheap op of one input
    of its size that an extern call wrote (`_over_extern`). Inputs are in memory already, and
    a value kiln does not recompute is written where it is computed. `forward`: the nodes the
    forward runs for its outputs; a reader outside it is the backward's, tangents or not (the
    `exp` of log-softmax's output that its gradient reads)."""
    if n.op != "call_function" or not is_recomputable(n):
        return True, False
    fw = n in fw_outs
    bw = False
    fw_readers = 0
    todo = [n]
    while todo:
        v = todo.pop()
        for u in v.users:
            if u.op != "call_function":
                continue
            if _is_view(u):
                fw |= u in fw_outs
                todo.append(u)
            elif u not in forward:
                bw |= not _fusible(u)
            else:
                fw |= not _fusible(u)
                fw_readers += 1
    return fw or fw_readers > 1 and not _over_extern(n), bw


def _over_extern(n: torch.fx.Node) -> bool:
    """Is `n` computed from one input of its own size, and that an extern call's result
    (through views: a matmul's logits, less their row maximum)? That input is in memory, so each
    kernel reading `n` computes it again for the bytes that reading `n` would cost: the forward
    need not write `n`, and saving `n` rather than the logits writes one tensor more."""
    size = _numel(n)
    full = [a for a in n.all_input_nodes if size is not None and _numel(a) == size]
    if len(full) != 1:
        return False
    a = full[0]
    while _is_view(a):
        a = a.all_input_nodes[0]
    if a.op != "call_function" or _fusible(a):
        return False
    return not (isinstance(a.target, torch._ops.OpOverload) and a.target.overloadpacket in _GATHERS)


def _numel(n: torch.fx.Node) -> int | None:
    val = n.meta.get("val")
    return hint(val.numel()) if isinstance(val, torch.Tensor) else None


def _cut_weights(nodes, forward: set, fw_outs: set) -> tuple[dict, set]:
    """(the weight of saving each node, the nodes that must not be recomputed) for the min cut.

    A saved value costs its bytes, twice over when the forward would not otherwise write it:
    saving a GELU's derivative instead of the matmul output it is computed from costs the same
    memory, but writes one more tensor. A cheap value that both passes must write (a GELU's
    output feeding the next matmul, whose weight gradient reads it again) is kept, not
    recomputed: recomputing saves its bytes but writes it a second time and reads its inputs
    again, as PyTorch's partitioner also judges (its `is_materialized_backwards`). Values made
    from no tensor (fills, `arange`) stay recomputable: writing them reads nothing."""
    weight, keep = {}, set()
    for n in nodes:
        fw, bw = _writes(n, forward, fw_outs)
        weight[n] = value_bytes(n) * (1 if fw else 2)
        if fw and bw and n.all_input_nodes and not _is_view(n):
            keep.add(n)
    return weight, keep


def _outputs(gm: torch.fx.GraphModule) -> list:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return list(torch.utils._pytree.tree_leaves(out.args[0]))


def _ancestors(roots, stop) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    todo = [r for r in roots if isinstance(r, torch.fx.Node)]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n not in stop:
            todo.extend(n.all_input_nodes)
    return seen


def _with_region_helpers(nodes: list, checkpointed: set, tangent_dep: set) -> set:
    """`checkpointed` and the values autograd made from them for the backward only (SiLU's
    `1 - sigmoid` built as `fill(empty_like(sigmoid), 1) - sigmoid`): cheap, unmarked (they
    were traced in the backward), computed from the region's values and read by nothing but
    the backward. Saved, they would keep a checkpointed layer's activation alive after all;
    they are recomputed with the region."""
    if not checkpointed:
        return checkpointed
    helpers: list = []
    inside = set(checkpointed)
    for n in nodes:  # topological: a node's inputs are decided before it
        if n in inside or n.op != "call_function" or not is_recomputable(n):
            continue
        if n.all_input_nodes and all(a in inside for a in n.all_input_nodes):
            helpers.append(n)
            inside.add(n)
    kept = set(helpers)
    for n in reversed(helpers):  # users first: a helper read by a dropped one is dropped too
        if any(u not in tangent_dep and u not in kept for u in n.users):
            kept.discard(n)
    return checkpointed | kept


def partition_joint(joint: Joint, strategy: str = "min_cut") -> Partition:
    """Forward and backward graphs from the joint graph (see the module docstring)."""
    if strategy not in ("min_cut", "save_all"):
        raise ValueError(f"partition strategy {strategy!r}: choose 'min_cut' or 'save_all'")
    graph = joint.gm.graph
    placeholders = graph.find_nodes(op="placeholder")
    primals = placeholders[: joint.num_primals]
    tangents = placeholders[joint.num_primals :]
    outs = _outputs(joint.gm)
    n_fw = joint.num_fw_outputs
    fw_outs, grads = outs[:n_fw], outs[n_fw:]

    tangent_dep: set[torch.fx.Node] = set(tangents)
    for n in graph.nodes:
        if n.op == "call_function" and any(a in tangent_dep for a in n.all_input_nodes):
            tangent_dep.add(n)
    grad_present = [isinstance(g, torch.fx.Node) and g in tangent_dep for g in grads]
    live_grads = [g for g, keep in zip(grads, grad_present) if keep]

    bw_nodes = _ancestors(live_grads, stop=set())
    forward_nodes = [
        n for n in graph.nodes if n.op in ("placeholder", "call_function") and n not in tangent_dep
    ]
    sizes = {n for n in forward_nodes if is_size(n)}
    forward_nodes = [n for n in forward_nodes if n not in sizes]
    read_by_backward = {
        n
        for n in forward_nodes
        if n in bw_nodes and (n in live_grads or any(u in tangent_dep for u in n.users))
    }
    notes: list[str] = []
    saved = None
    if strategy == "min_cut":
        relevant = [n for n in forward_nodes if n in bw_nodes]
        forward = _ancestors(fw_outs, stop=set())
        weight, keep = _cut_weights(relevant, forward, set(fw_outs))
        marked = {n for n in relevant if must_recompute(n)}
        region_outputs = {n for n in marked if _leaves_region(n, forward)}
        checkpointed = _with_region_helpers(relevant, marked - region_outputs, tangent_dep)
        for n in checkpointed:  # never saved: the backward runs the region again
            weight[n] = mincut.INF
        if checkpointed:
            notes.append(f"checkpointed: {len(checkpointed)} values recomputed, never saved")
        saved = mincut.choose_saved(
            relevant,
            {n: list(n.users) for n in relevant},
            {
                n
                for n in relevant
                if n.op == "placeholder"
                or n in region_outputs  # saved, as eager saves the next checkpoint's input
                or n not in checkpointed
                and (not is_recomputable(n) or n in keep)
            },
            read_by_backward,
            weight,
        )
        if saved is None:
            notes.append("no finite cut (a value that cannot be saved is needed): saved all")
    if saved is None:
        saved = [n for n in forward_nodes if n in read_by_backward]
        strategy = "save_all"

    reads = _ancestors(live_grads, stop={*saved, *tangents, *sizes})
    saved_sizes = [n for n in graph.nodes if n in sizes and n in reads]
    fw = _forward_graph(joint.gm, primals, fw_outs, [*saved, *saved_sizes])
    bw, recomputed = _backward_graph(
        joint.gm, saved, saved_sizes, tangents, live_grads, tangent_dep
    )
    return Partition(
        fw=fw,
        bw=bw,
        num_fw_outputs=n_fw,
        saved=[n.name for n in saved],
        saved_bytes=sum(value_bytes(n) for n in saved),
        recomputed=recomputed,
        grad_present=grad_present,
        strategy=strategy,
        notes=notes,
        saved_sizes=[n.name for n in saved_sizes],
    )


def _forward_graph(joint_gm, primals, fw_outs, saved) -> torch.fx.GraphModule:
    needed = _ancestors([*fw_outs, *saved], stop=set())
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in joint_gm.graph.nodes:
        if n in primals:
            env[n] = g.placeholder(n.name)
            env[n].meta = dict(n.meta)
        elif n.op in ("call_function", "get_attr") and n in needed:
            env[n] = g.node_copy(n, lambda a: env[a])
    g.output(tuple(env[o] if isinstance(o, torch.fx.Node) else o for o in [*fw_outs, *saved]))
    g.lint()
    return LazyGraphModule(joint_gm, g, class_name="KilnForward")


def _backward_graph(joint_gm, saved, saved_sizes, tangents, live_grads, tangent_dep):
    """Backward nodes in the joint graph's order (the autograd engine's); each recomputed
    forward node is placed just before its first use, so recomputed values live briefly
    instead of all being rebuilt, and held, at the start of the backward. Placeholders: the
    saved tensors, the saved sizes, the tangents."""
    needed = _ancestors(live_grads, stop={*saved, *saved_sizes, *tangents})
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in [*saved, *saved_sizes, *tangents]:
        env[n] = g.placeholder(n.name)
        env[n].meta = dict(n.meta)
    recomputed = []

    def emit(root: torch.fx.Node) -> None:
        stack = [root]
        while stack:
            n = stack[-1]
            missing = [a for a in n.all_input_nodes if a not in env]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            if n in env:
                continue
            if n.op == "get_attr":  # a constant (make_fx's `_tensor_constantN`): no work
                pass
            elif n not in tangent_dep:
                if not (is_recomputable(n) or must_recompute(n)):  # the cut guarantees this
                    raise AssertionError(f"partition: {n.name} ({n.target}) recomputed in backward")
                recomputed.append(n.name)
            env[n] = g.node_copy(n, lambda a: env[a])

    for n in joint_gm.graph.nodes:
        if n in needed and n in tangent_dep and n.op == "call_function":
            emit(n)
    for gr in live_grads:
        emit(gr)
    g.output(tuple(env[gr] for gr in live_grads))
    g.lint()
    return LazyGraphModule(joint_gm, g, class_name="KilnBackward"), recomputed
