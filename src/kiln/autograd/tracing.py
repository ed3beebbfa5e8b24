"""From a torch-level graph to functional ATen graphs: the forward, the joint, the inference one.

Takes the captured `GraphModule`, its `GraphMeta` (analyze.py) and the call's inputs; gives
`torch.fx.GraphModule`s of ATen ops with no in-place ops and no input mutation, traced with
`make_fx` on fake tensors (nothing runs for real, no memory is allocated):

- `trace_functional_forward`: the torch-level graph through `torch.func.functionalize`, with
  only the decompositions autograd needs there (`decomps.functionalization_repairs`). Its
  outputs are `(new values of mutated inputs, fresh user outputs, bases of view outputs)`; the
  runtime writes the first group back into the inputs. Tensors made while grad mode is off are
  `detach`ed, so no-grad regions survive into the joint graph.
- `trace_joint`: forward and backward in one graph, by `torch.func.vjp` of the functional
  forward, under `functionalize` (backward formulas may use in-place ops) and kiln's
  decomposition table. Placeholders are `primals_*` then `tangents_*`; outputs are the forward's
  outputs then one gradient per input that requires grad.
- `trace_inference`: the forward alone, decomposed, for calls that need no backward.
- `trace_training`: the joint graph of a call that needs a backward; in one pass (`vjp` of
  the torch-level graph) when the graph mutates none of its inputs, else in two (the
  functional forward, then its joint), because a primal of `vjp` may not be mutated.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize
from torch.func import functionalize, vjp
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from ..lazy_graphs import lazy_graph_modules
from ..symbolic_dispatch import run_symbolic
from . import decomps
from .analyze import GradModeInterpreter, GraphMeta
from .symbolic import FakeWorld

aten = torch.ops.aten


@dataclass
class FunctionalForward:
    """A functional forward graph and the layout of its flat outputs."""

    gm: torch.fx.GraphModule
    num_mutated: int
    num_fresh: int
    num_bases: int
    requires_grad: list[bool]  # per flat output, from the fake run of the original graph

    @property
    def num_outputs(self) -> int:
        return self.num_mutated + self.num_fresh + self.num_bases


def _functional_body(gm: torch.fx.GraphModule, meta: GraphMeta, grad_enabled: bool, detach: bool):
    fresh_pos = [j for j, a in enumerate(meta.outputs) if a.kind == "fresh"]

    def body(*args):
        interp = GradModeInterpreter(gm, grad_enabled, detach_no_grad=detach)
        flat = pytree.tree_leaves(interp.run(*args))
        mutated = [args[i] for i in meta.mutated]
        fresh = [flat[j] for j in fresh_pos]
        bases = [interp.values[b] for b in meta.bases]
        return (*mutated, *fresh, *bases)

    return body


def has_recompute_marks(gm: torch.fx.GraphModule) -> bool:
    """Whether nodes of `gm` carry an activation-checkpointing mark (`meta["recompute"]`)."""
    return any(n.meta.get("recompute") for n in gm.graph.nodes)


def _trace(
    fn, args: list, mode: FakeTensorMode, decompositions: dict | None, marks=False, dispatch=False
):
    """The traced graph, as a lazy GraphModule (lazy_graphs.py): the later stages read it.
    `marks`: the graph run by `fn` has checkpointing marks; make_fx copies them (FX's
    preserved node meta) onto each ATen node traced while a marked node runs.
    `dispatch`: functionalise with the dispatch mode from the start (symbolic sizes: functorch's
    `functionalize` reads sizes as plain ints, which would pin every symbol to its hint)."""
    if not dispatch:
        try:
            with mode, lazy_graph_modules(), _keep_meta(marks):
                traced = make_fx(
                    functionalize(fn, remove="mutations"),
                    decomposition_table=decompositions or {},
                )(*args)
            _drop_input_copy_back(traced)
            return traced
        except RuntimeError as e:
            if not _functorch_refused(e):
                raise
    return _trace_dispatch(fn, args, mode, decompositions, marks, symbolic=dispatch)


def _trace_dispatch(fn, args: list, mode, decompositions, marks: bool, symbolic: bool):
    """make_fx of `fn` made functional by `FunctionalTensorMode` (a dispatch mode, below
    autograd); with symbolic sizes first under the Python dispatcher (`run_symbolic`)."""

    def run():
        with mode, lazy_graph_modules(), _keep_meta(marks):
            return make_fx(
                dispatch_functionalize(fn, FunctionalTensorMode()),
                decomposition_table=decompositions or {},
            )(*args)

    traced = run_symbolic(symbolic, run)
    _drop_input_copy_back(traced)
    return traced


def _keep_meta(marks: bool):
    return fx_traceback.preserve_node_meta() if marks else contextlib.nullcontext()


def _functorch_refused(e: RuntimeError) -> bool:
    """An autograd.Function met a functorch transform that cannot run it: `functionalize` runs
    none, `vjp` no old-style one (without `setup_context`, `forward(ctx, ...)`; the one
    torch.library makes for a custom op's registered backward is one). The graph is traced
    again with dispatch-mode functionalisation (and `torch.autograd.grad` for the joint),
    below autograd, where such Functions run their own forward and backward as in eager.
    A control-flow operator (torch.cond) has no rule for functorch's grad transform either
    (torch names the transform as its error); autograd differentiates it by torch's own rule."""
    msg = str(e)
    first = msg.split("\n", 1)[0]
    return "setup_context" in msg or "custom_function_call" in msg or first == "TransformType.Grad"


def _drop_input_copy_back(gm: torch.fx.GraphModule) -> None:
    """`functionalize` ends with `copy_(input, new_value)` for each mutated input; kiln returns
    the new values instead and writes them back in the runtime wrapper."""
    dropped = False
    for node in gm.graph.find_nodes(op="call_function", target=aten.copy_.default):
        if node.args[0].op == "placeholder" and not node.users:
            gm.graph.erase_node(node)
            dropped = True
    if dropped:
        gm.graph.lint()
        gm.recompile()


def _with_constants(fn, inputs: list):
    """Non-tensor inputs are baked into the trace; the graph takes only the tensors."""
    tensor_pos = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    if len(tensor_pos) == len(inputs):
        return fn

    def with_constants(*tensors):
        args = list(inputs)
        for i, t in zip(tensor_pos, tensors):
            args[i] = t
        return fn(*args)

    return with_constants


def _layout(meta: GraphMeta) -> dict:
    return dict(
        num_mutated=len(meta.mutated),
        num_fresh=sum(a.kind == "fresh" for a in meta.outputs),
        num_bases=len(meta.bases),
        requires_grad=[*meta.mutated_requires_grad, *meta.fresh_requires_grad]
        + list(meta.base_requires_grad),
    )


def trace_functional_forward(
    gm: torch.fx.GraphModule,
    meta: GraphMeta,
    inputs: list,
    grad_enabled: bool,
    world: FakeWorld | None = None,
) -> FunctionalForward:
    """Stage 1 of training: functional ATen forward, no decompositions, no-grad made explicit."""
    world = world or FakeWorld.static()
    body = _with_constants(_functional_body(gm, meta, grad_enabled, detach=True), inputs)
    repairs = decomps.functionalization_repairs()
    traced = _trace(
        body,
        world.tensor_fakes(inputs),
        world.mode,
        repairs,
        has_recompute_marks(gm),
        dispatch=world.symbolic,
    )
    _keep_attention_logsumexp(traced)
    return FunctionalForward(traced, **_layout(meta))


# Fused attention ops whose backward reads the forward's logsumexp, which they only compute when
# asked (argument 4, `compute_log_sumexp`).
_LSE_FLAG = {
    aten._scaled_dot_product_efficient_attention.default: 4,
    aten._scaled_dot_product_cudnn_attention.default: 4,
}


def _keep_attention_logsumexp(gm: torch.fx.GraphModule) -> None:
    """`scaled_dot_product_attention` picks `compute_log_sumexp=query.requires_grad` when it
    decomposes; the stage-1 trace runs on detached fake tensors, so it picked False, and the
    backward would get an empty logsumexp (wrong gradients, or ATen's "LSE is not correctly
    aligned"). A training forward always computes it."""
    changed = False
    for node in gm.graph.nodes:
        pos = _LSE_FLAG.get(node.target) if node.op == "call_function" else None
        if pos is not None and len(node.args) > pos and node.args[pos] is False:
            node.args = (*node.args[:pos], True, *node.args[pos + 1 :])
            changed = True
    if changed:
        gm.recompile()


def trace_inference(
    gm: torch.fx.GraphModule,
    meta: GraphMeta,
    inputs: list,
    grad_enabled: bool,
    decompositions: dict,
    world: FakeWorld | None = None,
) -> FunctionalForward:
    """The whole forward as one functional, decomposed ATen graph; no autograd."""
    world = world or FakeWorld.static()
    body = _with_constants(_functional_body(gm, meta, grad_enabled, detach=False), inputs)
    fakes = world.tensor_fakes(inputs)
    traced = _trace(body, fakes, world.mode, decompositions, dispatch=world.symbolic)
    return FunctionalForward(traced, **_layout(meta))


@dataclass
class Joint:
    """The joint graph and what its placeholders and outputs mean."""

    gm: torch.fx.GraphModule
    num_primals: int  # placeholders before the tangents: the call's tensor inputs
    num_fw_outputs: int  # outputs before the gradients: a functional forward's (see `_layout`)
    diff_inputs: list[int]  # tensor-input positions that get a gradient (primals requiring grad)
    diff_outputs: list[int]  # forward-output positions that take a tangent


def trace_training(
    gm: torch.fx.GraphModule,
    meta: GraphMeta,
    inputs: list,
    grad_enabled: bool,
    decompositions: dict,
    world: FakeWorld | None = None,
) -> Joint:
    """The joint graph of a call that needs a backward. A graph that mutates none of its inputs
    is traced in one pass: `vjp` of the torch-level graph itself, under `functionalize`
    (autograd sees the in-place ops on intermediates and differentiates them; functionalisation
    below it makes forward and backward functional). One that mutates an input is made
    functional first (`trace_functional_forward`, then `trace_joint`), because a primal of
    `vjp` may not be mutated. The one pass saves a whole trace of the forward (0.2-0.3 s of a
    six-layer GPT's cold compile on the H200 host)."""
    world = world or FakeWorld.static()
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if meta.mutated:
        fw = trace_functional_forward(gm, meta, inputs, grad_enabled, world)
        return trace_joint(fw, inputs, decompositions, world)
    body = _with_constants(_functional_body(gm, meta, grad_enabled, detach=True), inputs)
    requires_grad = _layout(meta)["requires_grad"]
    marks = has_recompute_marks(gm)
    primals = world.tensor_fakes(inputs)
    return _trace_vjp(
        body, tensors, primals, requires_grad, meta.value_specs, decompositions, world, marks
    )


def trace_joint(
    fw: FunctionalForward, inputs: list, decompositions: dict, world: FakeWorld | None = None
) -> Joint:
    """Stage 2 of training: `vjp` of the functional forward, traced as one functional graph.
    `inputs`: the call's inputs (the forward takes their tensors)."""
    world = world or FakeWorld.static()
    specs = [(v.shape, v.dtype, v.device) for v in _output_values(fw.gm)]
    marks = has_recompute_marks(fw.gm)
    # an Interpreter, not the graph's code, sets the node whose meta make_fx copies
    forward = (lambda *a: torch.fx.Interpreter(fw.gm).run(*a)) if marks else fw.gm
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    primals = world.tensor_fakes(inputs)
    return _trace_vjp(
        forward, tensors, primals, fw.requires_grad, specs, decompositions, world, marks
    )


def _trace_vjp(
    forward,
    tensor_inputs: list,
    primals: list,
    requires_grad: list[bool],
    specs: list,
    decompositions: dict,
    world: FakeWorld,
    marks: bool = False,
) -> Joint:
    """`forward` (tensors in, its flat outputs out) and its `vjp`, traced as one functional graph:
    placeholders `primals_*` then `tangents_*` (one per output that requires grad, of the shape
    `specs` gives), outputs the forward's then one gradient per input that requires grad.
    `primals`: fakes of `tensor_inputs` in `world`. With symbolic sizes the joint is traced with
    `torch.autograd.grad` below a dispatch-mode functionalisation: functorch's `vjp` and
    `functionalize` read sizes as plain ints (they would pin each symbol to its hint)."""
    diff_inputs = [i for i, x in enumerate(tensor_inputs) if x.requires_grad]
    diff_outputs = [j for j, rg in enumerate(requires_grad) if rg]

    def joint(primals, tangents):
        def differentiable_part(*diff):
            args = list(primals)
            for i, d in zip(diff_inputs, diff):
                args[i] = d
            outs = forward(*args)
            return tuple(outs[j] for j in diff_outputs), tuple(outs)

        diff_primals = [primals[i] for i in diff_inputs]
        _, pullback, outs = vjp(differentiable_part, *diff_primals, has_aux=True)
        grads = pullback(tuple(tangents))
        return (*outs, *grads)

    mode = world.mode
    with mode:
        tangents = [
            torch.empty(shape, dtype=dtype, device=device)
            for shape, dtype, device in (specs[j] for j in diff_outputs)
        ]
    traced = None
    if not world.symbolic:
        try:
            traced = _trace(joint, [primals, tangents], mode, decompositions, marks)
        except RuntimeError as e:
            if not _functorch_refused(e):
                raise
    if traced is None:
        traced = _trace_autograd(
            forward,
            primals,
            tangents,
            diff_inputs,
            diff_outputs,
            mode,
            decompositions,
            marks,
            world.symbolic,
        )
    return Joint(traced, len(primals), len(requires_grad), diff_inputs, diff_outputs)


def _trace_autograd(
    forward,
    primals,
    tangents,
    diff_inputs,
    diff_outputs,
    mode,
    decompositions,
    marks=False,
    symbolic=False,
):
    """The joint graph by `torch.autograd.grad` on fake inputs that require grad, made
    functional by `FunctionalTensorMode` (a dispatch mode, below autograd): old-style
    autograd.Functions run their own forward and backward here as in eager."""
    leaves = list(primals)
    for i in diff_inputs:
        leaves[i] = primals[i].detach().requires_grad_(True)

    def joint(primals, tangents):
        with torch.enable_grad():
            outs = tuple(forward(*primals))
        diff = [outs[j] for j in diff_outputs]
        wrt = [primals[i] for i in diff_inputs]
        grads = torch.autograd.grad(diff, wrt, tangents, allow_unused=True) if diff else ()
        return (*[o.detach() for o in outs], *grads)

    return _trace_dispatch(joint, [leaves, tangents], mode, decompositions, marks, symbolic)


def _output_values(gm: torch.fx.GraphModule) -> list:
    out = gm.graph.output_node() if hasattr(gm.graph, "output_node") else None
    if out is None:
        out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return [a.meta["val"] for a in pytree.tree_leaves(out.args[0])]
