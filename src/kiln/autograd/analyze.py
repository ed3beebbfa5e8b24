"""What a captured graph does to its inputs and how its outputs alias: one run on fake tensors.

Takes the torch-level `GraphModule` from capture and the call's real inputs; gives a
`GraphMeta`: which inputs it mutates, which outputs are inputs, views of inputs, views of other
values or duplicates, which outputs require grad, and the grad mode it leaves behind. The later
stages trace a *functional* graph, which has no aliasing; this record is what lets the runtime
wrapper (runtime.py) give the user eager's aliasing and in-place effects back.

`GradModeInterpreter` runs a torch-level graph honouring `torch._C._set_grad_enabled` nodes
without touching the process's grad mode; tracing.py reuses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..symbolic_dispatch import run_symbolic
from .errors import AotUnsupported
from .symbolic import FakeWorld, is_symbolic

_SET_GRAD = torch._C._set_grad_enabled


class GradModeInterpreter(torch.fx.Interpreter):
    """Runs a torch-level graph node by node; `_set_grad_enabled(b)` nodes switch a flag that
    every later node runs under, instead of switching the process's mode for good.

    With `detach_no_grad`, tensors made while grad is off are detached, so that a functional
    trace of the graph keeps eager's "no gradient flows through here" as explicit `detach` ops.
    """

    def __init__(self, gm: torch.fx.GraphModule, grad_enabled: bool, detach_no_grad: bool = False):
        super().__init__(gm)
        self.grad_enabled = grad_enabled
        self.detach_no_grad = detach_no_grad
        self.values: dict[torch.fx.Node, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op == "call_function" and n.target is _SET_GRAD:
            self.grad_enabled = bool(n.args[0])
            return None
        with torch.set_grad_enabled(self.grad_enabled):
            out = super().run_node(n)
        if self.detach_no_grad and not self.grad_enabled and n.op != "placeholder":
            out = pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, out)
        self.values[n] = out
        return out


def has_grad_mode_nodes(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and n.target is _SET_GRAD for n in gm.graph.nodes)


@dataclass(frozen=True)
class OutputAlias:
    """How one user output relates to other values.

    kind: "fresh" (a graph output of its own), "input" (is input `index` itself), "input_view"
    (a view of input `index`), "dup" (the same tensor as user output `index`), "base_view" (a
    view of graph value `base`, returned as an extra output), "const" (not a tensor: `value`),
    "sym" (a number computed from symbolic sizes: `value` is the SymInt, evaluated per call).
    With symbolic sizes, `size`, `stride` and `offset` may be SymInts (`GraphMeta.symbolic`).
    """

    kind: str
    index: int = -1
    base: torch.fx.Node | None = None
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    offset: int = 0
    dtype: torch.dtype | None = None
    requires_grad: bool = False
    value: Any = None


@dataclass
class GraphMeta:
    """The fake run's findings. `outputs` follows the flattened user output order."""

    num_inputs: int
    mutated: list[int] = field(default_factory=list)
    mutated_requires_grad: list[bool] = field(default_factory=list)
    outputs: list[OutputAlias] = field(default_factory=list)
    out_spec: Any = None
    bases: list[torch.fx.Node] = field(default_factory=list)
    base_requires_grad: list[bool] = field(default_factory=list)
    fresh_requires_grad: list[bool] = field(default_factory=list)
    grad_mode_nodes: bool = False
    final_grad_mode: bool = True
    # (shape, dtype, device) of each value a functional trace returns, in its order: mutated
    # inputs, fresh outputs, bases (the shapes of the tangents a joint trace takes)
    value_specs: list[tuple] = field(default_factory=list)
    # user outputs whose value or view geometry depends on symbolic sizes: the runtime
    # computes them per call (runtime.py, `SymbolicOutputs`)
    symbolic: list[int] = field(default_factory=list)

    @property
    def needs_autograd(self) -> bool:
        return (
            any(self.mutated_requires_grad)
            or any(self.fresh_requires_grad)
            or any(self.base_requires_grad)
        )


def _storage(t: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(t.untyped_storage())


def analyze(
    gm: torch.fx.GraphModule, inputs: list, grad_enabled: bool, world: FakeWorld | None = None
) -> GraphMeta:
    """Run `gm` once on fake copies of `inputs` and record mutation and aliasing. `world`: the
    fake mode and inputs (symbolic.py); None: a fresh mode and fakes of `inputs`' sizes."""
    world = world or FakeWorld(FakeTensorMode(allow_non_fake_inputs=False))
    mode = world.mode

    def run():
        fakes = world.input_fakes(inputs)
        tensors = [x for x in fakes if isinstance(x, torch.Tensor)]
        before = [(x._version, x.shape, x.stride(), x.storage_offset()) for x in tensors]
        grad_fns = [x.grad_fn for x in tensors]
        interp = GradModeInterpreter(gm, grad_enabled)
        writes = _WrittenTensors()
        with mode, writes:
            out = interp.run(*fakes)
        return fakes, tensors, before, grad_fns, interp, writes, out

    fakes, tensors, before, grad_fns, interp, writes, out = run_symbolic(world.symbolic, run)
    flat, spec = pytree.tree_flatten(out)
    meta = GraphMeta(num_inputs=len(fakes), out_spec=spec)
    meta.grad_mode_nodes = has_grad_mode_nodes(gm)
    meta.final_grad_mode = interp.grad_enabled

    tensor_pos = [i for i, x in enumerate(fakes) if isinstance(x, torch.Tensor)]
    for pos, x, (version, shape, stride, offset), grad_fn in zip(
        tensor_pos, tensors, before, grad_fns
    ):
        if (x.shape, x.stride(), x.storage_offset()) != (shape, stride, offset):
            raise AotUnsupported(
                f"input {pos} changes shape or strides in place (resize_, t_, as_strided_, ...)",
                "make the reshaping out of place (x = x.t()), or compile with backend='eager'",
            )
        if x._version != version or id(x) in writes.ids:
            meta.mutated.append(pos)
            # autograd saw the change only if it gave the input a new history: a parameter an
            # optimizer updates under no_grad keeps requires_grad but needs no gradient
            meta.mutated_requires_grad.append(bool(x.requires_grad) and x.grad_fn is not grad_fn)
    _check_mutated_inputs_do_not_alias(meta, inputs)

    node_of = {id(v): n for n, v in interp.values.items() if isinstance(v, torch.Tensor)}
    input_storages: dict[StorageWeakRef, int] = {}  # storage -> the first input of it
    for pos in tensor_pos:
        input_storages.setdefault(_storage(fakes[pos]), pos)
    for j, o in enumerate(flat):
        meta.outputs.append(_classify(j, o, flat, fakes, input_storages, node_of, meta))
    fresh = [o for o, a in zip(flat, meta.outputs) if a.kind == "fresh"]
    values = [fakes[i] for i in meta.mutated] + fresh + [interp.values[b] for b in meta.bases]
    meta.value_specs = [(tuple(v.shape), v.dtype, v.device) for v in values]
    meta.symbolic = [j for j, a in enumerate(meta.outputs) if _depends_on_symbols(a)]
    return meta


def _depends_on_symbols(alias: OutputAlias) -> bool:
    if alias.kind == "sym":
        return True
    if alias.kind not in ("input_view", "base_view"):
        return False
    return any(is_symbolic(v) for v in (*alias.size, *alias.stride, alias.offset))


class _WrittenTensors(TorchDispatchMode):
    """Ids of the tensors ATen ops write to, by their schemas. Fake tensors' version counters
    miss some writes (`_foreach_add_` on fakes runs as out-of-place ops and copies)."""

    # control-flow operators (torch.cond, while_loop) pass through: capture only records them
    # when no branch writes to a tensor from outside it (capture/higher_order.py)
    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if func._schema.is_mutable:
            for i, arg in enumerate(func._schema.arguments):
                if arg.alias_info is None or not arg.alias_info.is_write:
                    continue
                value = args[i] if i < len(args) else kwargs.get(arg.name)
                for t in pytree.tree_leaves(value):
                    if isinstance(t, torch.Tensor):
                        self.ids.add(id(t))
        return func(*args, **kwargs)


def _check_mutated_inputs_do_not_alias(meta: GraphMeta, inputs: list) -> None:
    """(On the real inputs: a symbolic world's fakes do not share storage as they do.) The
    inputs are grouped by storage once: an optimizer step mutates hundreds of its inputs, and
    comparing each with every input was most of the graph's analysis (GPT-2's AdamW step:
    592 mutated of 741, 876,901 storage lookups)."""
    sharing: dict[StorageWeakRef, list[int]] = {}
    for k, x in enumerate(inputs):
        if isinstance(x, torch.Tensor):
            sharing.setdefault(_storage(x), []).append(k)
    for i in meta.mutated:
        for k in sharing[_storage(inputs[i])]:
            if k != i:
                raise AotUnsupported(
                    f"input {i} is mutated in place and shares memory with input {k}",
                    "pass separate tensors (clone one of them), or compile with backend='eager'",
                )


def _classify(j, o, flat, fakes, input_storages, node_of, meta: GraphMeta) -> OutputAlias:
    if is_symbolic(o):
        return OutputAlias("sym", value=o)
    if isinstance(o, (torch.SymInt, torch.SymFloat, torch.SymBool)):  # a constant after all
        plain = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(o)]
        return OutputAlias("const", value=plain(o))
    if not isinstance(o, torch.Tensor):
        return OutputAlias("const", value=o)
    geometry = dict(
        size=tuple(o.shape),
        stride=tuple(o.stride()),
        offset=o.storage_offset(),
        dtype=o.dtype,
        requires_grad=bool(o.requires_grad),
    )
    pos = input_storages.get(_storage(o))
    if pos is not None:
        if o is fakes[pos]:
            return OutputAlias("input", index=pos, **geometry)
        return OutputAlias("input_view", index=pos, **geometry)
    for k in range(j):
        if flat[k] is o:
            return OutputAlias("dup", index=k, **geometry)
    base = o._base if o._is_view() else None
    if base is not None and id(base) in node_of:
        node = node_of[id(base)]
        if node not in meta.bases:
            meta.bases.append(node)
            meta.base_requires_grad.append(bool(base.requires_grad))
        geometry["offset"] = o.storage_offset() - base.storage_offset()
        return OutputAlias("base_view", base=node, **geometry)
    meta.fresh_requires_grad.append(bool(o.requires_grad))
    return OutputAlias("fresh", **geometry)
