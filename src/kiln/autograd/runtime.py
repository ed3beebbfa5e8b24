"""Running compiled graphs with eager's semantics: autograd, mutation write-back, aliasing.

Takes compiled forward/backward callables (what `fw_compiler` / `bw_compiler` returned) plus
the `GraphMeta` of the original graph; gives entries that take the call's flat inputs and
return what the original graph returned:

- `TrainingEntry` runs forward and backward as one `torch.autograd.Function`
  (`CompiledFunction`). The forward returns the user-visible values and saves what the
  partition chose; the backward feeds saved values and tangents to the compiled backward.
- `InferenceEntry` runs one forward graph, no autograd.

Both then write new values of mutated inputs back into the inputs (`copy_`, so the caller's
tensors and module buffers change as in eager; an input the compiled graph wrote itself and
returned needs no copy, only a version bump), and rebuild outputs that eager would have
returned as aliases: an input itself, a view of an input, a view of another output, the same
tensor twice. Views are rebuilt with `as_strided` on the real base, so `_base`, storage sharing
and gradients through the view behave as in eager.

With symbolic sizes, the forward also returns the sizes the backward reads (ints, kept on the
autograd node beside the saved tensors), and an output that is a size, or a view whose
geometry depends on sizes, is computed per call from the inputs' sizes (`SymbolicOutputs`).

Double backward (`create_graph=True`) is refused in the backward with `DOUBLE_BACKWARD_MESSAGE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.utils import _pytree as pytree

from ..gc_pause import saved_tensor_hooks_suspended
from .analyze import GraphMeta, OutputAlias
from .errors import DOUBLE_BACKWARD_MESSAGE

if TYPE_CHECKING:
    from .sizes import SizeReader
    from .zero_tangents import KeptZeroTangents, ZeroTangents


@dataclass
class TrainingPlan:
    """Everything the autograd.Function needs, fixed at compile time."""

    fw: Callable
    bw: Callable
    num_fw_outputs: int
    diff_outputs: list[int]  # forward outputs that take a tangent
    non_diff_outputs: list[int]
    diff_inputs: list[int]  # tensor-input positions that may get a gradient
    grad_present: list[bool]  # per diff input: does the backward return one?
    num_tensor_inputs: int
    clone_saved: list[int]  # saved values that are inputs mutated later: saved as copies
    num_saved_sizes: int = 0  # the forward's last outputs: ints the backward takes
    # Backwards for calls where some outputs get no gradient (zero_tangents.py); None: autograd
    # passes zeros for those. A loaded entry's (the artifact cache) are `KeptZeroTangents`.
    zero_tangents: ZeroTangents | KeptZeroTangents | None = None


def call_compiled(fn: Callable, args: list):
    """Call a compiled graph: boxed ones (`_boxed_call`) take the list and may empty it."""
    if getattr(fn, "_boxed_call", False):
        return fn(args)
    return fn(*args)


class CompiledFunction(torch.autograd.Function):
    """One compiled forward and its compiled backward, as a single autograd node."""

    @staticmethod
    def forward(ctx, plan: TrainingPlan, *tensors: torch.Tensor):
        outs = call_compiled(plan.fw, list(tensors))
        fw_outs = list(outs[: plan.num_fw_outputs])
        end = len(outs) - plan.num_saved_sizes
        saved = list(outs[plan.num_fw_outputs : end])
        for k in plan.clone_saved:
            saved[k] = saved[k].clone()
        ctx.save_for_backward(*saved)
        ctx.saved_sizes = tuple(outs[end:])
        ctx.plan = plan
        ctx.mark_non_differentiable(*(fw_outs[j] for j in plan.non_diff_outputs))
        if plan.zero_tangents is not None:  # an unused output's gradient stays None
            ctx.set_materialize_grads(False)
        return tuple(fw_outs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        if torch.is_grad_enabled():
            raise RuntimeError(DOUBLE_BACKWARD_MESSAGE)
        plan: TrainingPlan = ctx.plan
        tangents = [grads[j] for j in plan.diff_outputs]
        backward = plan.bw
        absent = tuple(k for k, g in enumerate(tangents) if g is None)
        if absent:  # only with plan.zero_tangents: a backward that reads zeros for them
            assert plan.zero_tangents is not None
            with saved_tensor_hooks_suspended():
                backward = plan.zero_tangents.backward(absent)
            tangents = [g for g in tangents if g is not None]
        args = [*ctx.saved_tensors, *ctx.saved_sizes, *(g.contiguous() for g in tangents)]
        if hasattr(ctx, "maybe_clear_saved_tensors"):  # unless retain_graph: `args` holds them
            ctx.maybe_clear_saved_tensors()  # now, and a boxed graph frees each when it is dead
        del grads, tangents
        computed = iter(call_compiled(backward, args))
        result: list[Any] = [None] * plan.num_tensor_inputs
        for pos, present in zip(plan.diff_inputs, plan.grad_present):
            if present:
                result[pos] = next(computed)
        return (None, *result)


def _tensors(args) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor)]


def _rebuild_view(base: torch.Tensor, alias: OutputAlias, geometry: tuple) -> torch.Tensor:
    size, stride, offset = geometry
    src = base if base.dtype == alias.dtype else base.view(alias.dtype)
    with torch.set_grad_enabled(alias.requires_grad):
        return src.as_strided(size, stride, offset)


class SymbolicOutputs:
    """Per call, the values of the outputs that depend on symbolic sizes (`GraphMeta.symbolic`):
    a size the graph returns, or the size, stride and offset of a view it returns; read from
    the call's inputs by one compiled function (sizes.py, `SizeReader`)."""

    def __init__(self, spans: dict[int, tuple[int, int, int]], read: Callable) -> None:
        self.spans = spans  # output -> (start, ndim, kind)
        self.read = read  # args -> the values, flat (`read.source`: its code, symbolic.py)

    @classmethod
    def of(cls, meta: GraphMeta, reader: SizeReader) -> SymbolicOutputs:
        values: list = []
        spans: dict[int, tuple[int, int, int]] = {}
        for j in meta.symbolic:
            alias = meta.outputs[j]
            if alias.kind == "sym":
                spans[j] = (len(values), 0, 0)
                values.append(alias.value)
            else:
                spans[j] = (len(values), len(alias.size), 1)
                values += [*alias.size, *alias.stride, alias.offset]
        return cls(spans, reader.compile(values, "symbolic_outputs"))

    def __call__(self, args) -> dict[int, Any]:
        v = self.read(args)
        out: dict[int, Any] = {}
        for j, (k, nd, kind) in self.spans.items():
            out[j] = v[k] if kind == 0 else (v[k : k + nd], v[k + nd : k + 2 * nd], v[k + 2 * nd])
        return out


def _write_back(meta: GraphMeta, args, new_values) -> None:
    in_place = []
    for pos, value, tracked in zip(meta.mutated, new_values, meta.mutated_requires_grad):
        target = args[pos]
        if value is target:  # the compiled graph wrote the input itself (schedule/inplace.py)
            in_place.append(target)
            continue
        # as eager changed it: recorded by autograd, or not (an optimizer's no_grad update of
        # a leaf that requires grad, which autograd would refuse to record)
        with torch.set_grad_enabled(tracked and value.requires_grad):
            target.copy_(value)
    if in_place:  # changed behind autograd's back: its version check must still see it
        torch.autograd.graph.increment_version(in_place)


def _assemble(meta: GraphMeta, args, fresh, bases, sym: dict[int, Any]) -> Any:
    flat: list[Any] = []
    fresh_it = iter(fresh)
    for j, alias in enumerate(meta.outputs):
        if alias.kind == "fresh":
            flat.append(next(fresh_it))
        elif alias.kind == "const":
            flat.append(alias.value)
        elif alias.kind == "sym":
            flat.append(sym[j])
        elif alias.kind == "input":
            flat.append(args[alias.index])
        elif alias.kind == "input_view":
            geometry = sym.get(j) or (alias.size, alias.stride, alias.offset)
            flat.append(_rebuild_view(args[alias.index], alias, geometry))
        elif alias.kind == "dup":
            flat.append(flat[alias.index])
        else:  # base_view
            base = bases[meta.bases.index(alias.base)]
            size, stride, offset = sym.get(j) or (alias.size, alias.stride, alias.offset)
            geometry = (size, stride, base.storage_offset() + offset)
            flat.append(_rebuild_view(base, alias, geometry))
    return pytree.tree_unflatten(flat, meta.out_spec)


_NO_SYMBOLS: dict[int, Any] = {}


def _finish(meta: GraphMeta, args, outs, symbolic: SymbolicOutputs | None = None) -> Any:
    k, f = len(meta.mutated), sum(a.kind == "fresh" for a in meta.outputs)
    _write_back(meta, args, outs[:k])
    sym = symbolic(args) if symbolic is not None else _NO_SYMBOLS
    result = _assemble(meta, args, outs[k : k + f], outs[k + f :], sym)
    if meta.grad_mode_nodes:
        torch._C._set_grad_enabled(meta.final_grad_mode)
    return result


class TrainingEntry:
    """Compiled forward + backward for one (grad mode, requires_grad pattern) of the inputs."""

    def __init__(
        self,
        meta: GraphMeta,
        plan: TrainingPlan,
        tensor_only: bool = False,
        symbolic: SymbolicOutputs | None = None,
    ):
        self.meta = meta
        self.plan = plan
        self.tensor_only = tensor_only  # every input is a tensor: nothing to filter out
        self.symbolic = symbolic

    def __call__(self, args) -> Any:
        with torch.enable_grad():
            tensors = args if self.tensor_only else _tensors(args)
            outs = CompiledFunction.apply(self.plan, *tensors)
        return _finish(self.meta, args, outs, self.symbolic)


class InferenceEntry:
    """One compiled forward graph; nothing in it needs a gradient."""

    def __init__(
        self,
        meta: GraphMeta,
        forward: Callable,
        tensor_only: bool = False,
        symbolic: SymbolicOutputs | None = None,
    ):
        self.meta = meta
        self.forward = forward
        self.tensor_only = tensor_only  # every input is a tensor: nothing to filter out
        self.symbolic = symbolic

    def __call__(self, args) -> Any:
        with torch.no_grad():
            # a fresh list either way: a boxed callable empties the one it is given
            tensors = list(args) if self.tensor_only else _tensors(args)
            outs = call_compiled(self.forward, tensors)
        return _finish(self.meta, args, outs, self.symbolic)
