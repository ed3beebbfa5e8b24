"""The decomposition table kiln traces with: which ATen ops become smaller ATen ops, and why.

Takes nothing; gives `default_decompositions()`, a `{OpOverload: fn}` table for `make_fx`, and
`DECOMPOSED`, the documented list of op names behind it. The functions themselves come from
`torch._decomp` (PyTorch's reference decompositions); kiln's choice is *which* ops to break up.

The rule kiln follows: decompose an op when its pieces are pointwise ops, views and simple
reductions that the code generator fuses better than it could call the op, and keep an op whole
when it is a library kernel worth calling (matmul, convolution, attention, embedding and its
backward, `_softmax`, `var_mean`, random ops). In practice:

- **Backward formulas** (`gelu_backward`, `native_layer_norm_backward`, ...) are long pointwise
  and reduction chains; decomposed they fuse with the surrounding backward work.
- **Normalisations** (`native_layer_norm`, `_native_batch_norm_legit_functional`, ...) become
  `var_mean` plus pointwise math, which fuses with the op before and after.
- **Small composites** (`silu`, `hardswish`, `addcmul`, `lerp`, losses) become pointwise math.
- **Kept whole:** `embedding_dense_backward`. Its decomposition is a zeros fill plus a masked
  `index_put` with accumulate, which no kiln kernel computes: as an extern call it cost 7x ATen's
  own kernel (0.5 vs 0.07 ms a nanoGPT step, the largest gap of its backward).

Ops PyTorch already decomposes before ATen (`CompositeImplicitAutograd`: `linear`, `dropout`,
`layer_norm`, `cross_entropy`, ...) never reach the table. A name that this torch version lacks
is skipped and listed by `missing_decompositions()` (torch 2.11 and 2.13 have all of them today).
Where torch has no decomposition kiln registers its own (`@register`, checked to be an ATen op).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch._decomp import decomposition_table as _TORCH_TABLE

from .foreach_decomps import WHY as FOREACH_WHY
from .foreach_decomps import foreach_decompositions

aten = torch.ops.aten

# Each entry: ATen op name (packet or "packet.overload") -> why kiln breaks it up.
DECOMPOSED: dict[str, str] = {}


def decompose(*names: str, why: str) -> None:
    """Add ATen ops (by name) to kiln's table; the names must exist in `torch.ops.aten`."""
    for name in names:
        packet = name.split(".")[0]
        if not hasattr(aten, packet):
            raise ValueError(f"kiln decompositions: torch.ops.aten has no op named {packet!r}")
        if name in DECOMPOSED:
            raise ValueError(f"kiln decompositions: {name!r} is listed twice")
        DECOMPOSED[name] = why


decompose(
    "sigmoid_backward",
    "tanh_backward",
    "threshold_backward",
    "gelu_backward",
    "silu_backward",
    "hardtanh_backward",
    "hardsigmoid_backward",
    "hardswish_backward",
    "leaky_relu_backward",
    "elu_backward",
    "softplus_backward",
    "mish_backward",
    "native_dropout_backward",
    why="pointwise backward formula: fuses with the gradient that feeds it",
)
decompose(
    "_softmax_backward_data",
    "_log_softmax_backward_data",
    "native_layer_norm_backward",
    "native_batch_norm_backward",
    "native_group_norm_backward",
    "mse_loss_backward",
    why="reduction + pointwise backward: fusable pieces instead of one opaque kernel",
)
decompose(
    "_log_softmax",
    why="amax, sum of exp and pointwise math (the kernels its lowering makes anyway): the "
    "partition then saves its input and two per-row statistics and recomputes the output in "
    "the backward, instead of keeping the output alive. A language model's cross-entropy under "
    "bf16 autocast saved a float32 tensor of the logits' size (1.65 GB for GPT-2 at 8 x 1024 "
    "tokens) where the bf16 logits (half that, and returned anyway) and two floats a row do",
)
decompose(
    "select_backward",
    "slice_backward",
    why="becomes a zeros + scatter the code generator writes as one kernel",
)
decompose(
    "native_layer_norm",
    "native_group_norm",
    "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit.no_stats",
    "_batch_norm_no_update.default",
    why="normalisation: var_mean + pointwise math that fuses with its neighbours",
)
decompose(
    "stack",
    why="cat of unsqueezed views: a kernel fused with its readers instead of an ATen call "
    "(a compiled optimizer step stacks one step size a parameter)",
)
decompose(
    "_safe_softmax",
    why="softmax whose fully masked rows give 0: `_softmax` (lowered), an all-reduction and a "
    "where, fused with the scaling and masking before it (BERT's attention on the H200: four "
    "ATen kernels a layer, 2.3 ms a forward, against one fused kernel of 0.6 ms)",
)
decompose(
    "silu",
    "mish",
    "hardswish",
    "hardsigmoid",
    "addcmul",
    "addcdiv",
    "lerp",
    "rsub",
    "mse_loss",
    "nll_loss_forward",
    why="small composite: a few pointwise ops",
)
decompose(
    "binary_cross_entropy_with_logits",
    "log_sigmoid_forward",
    "log_sigmoid_backward",
    why="loss of a few pointwise ops and a mean (its decomposition calls log_sigmoid, a few "
    "pointwise ops too, as is its backward); a static trace already runs ATen's composite "
    "kernel, but a symbolic one under the Python dispatcher meets torch's Python meta and "
    "kept the loss whole, an ATen call at dynamic sizes",
)


# kiln's own decompositions, for ops torch._decomp has none for.
_OWN: dict[torch._ops.OpOverload, Callable] = {}


def register(op: torch._ops.OpOverload, *, why: str):
    """Register kiln's own decomposition of an ATen overload (checked to be one)."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        raise ValueError(f"kiln decompositions: {op!r} is not an ATen op overload")

    def wrap(fn: Callable) -> Callable:
        if op in _OWN:
            raise ValueError(f"kiln decompositions: {op} registered twice")
        _OWN[op] = fn
        DECOMPOSED[str(op).removeprefix("aten.")] = why
        return fn

    return wrap


@register(aten.copy.default, why="functionalised copy_ has no derivative: expand + clone do")
def _copy(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    out = src.to(dtype=dst.dtype, device=dst.device)
    if out.shape != dst.shape:
        out = out.expand(dst.shape)
    return out.clone()


@register(
    aten.nll_loss_backward.default,
    why="the targets' one-hot as a comparison with an iota, pointwise: the cross-entropy "
    "backward becomes one fused kernel, where zeros + scatter was a buffer of the logits' size",
)
def _nll_loss_backward(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    reduction: int,
    ignore_index: int,
    total_weight: torch.Tensor,
) -> torch.Tensor:
    """d(nll_loss)/d(self): -grad (times the class weight, over the total weight for a mean) at
    each row's target class, 0 elsewhere and on rows whose target is `ignore_index`."""
    channel = 0 if self.dim() < 2 else 1
    if reduction == 1:  # mean
        grad_output = grad_output / total_weight
    if self.dim() == 1 and target.dim() > 0:  # no batch dimension: ATen reads target[0]
        target = target[0]
    target = target.unsqueeze(channel)
    classes = torch.arange(self.shape[channel], device=self.device)
    hit = (classes == target) & (target != ignore_index)
    if grad_output.dim() > 0 and self.dim() > grad_output.dim():
        grad_output = grad_output.unsqueeze(channel)
    scale = -grad_output if weight is None else -grad_output * weight
    # where, not a product: a mean whose every target is ignored divides by a total weight of
    # 0, and ATen still gives 0 (not 0 * inf) at the places it skips
    return torch.where(hit, scale, 0)


def _eval_affine(x, weight, bias, mean, var, eps: float) -> torch.Tensor:
    """Batch norm with running statistics as one multiply-add per element, `x * scale + shift`
    with per-channel `scale = weight / sqrt(var + eps)` and `shift = bias - mean * scale`,
    computed in float32 for half types and rounded once, as torch's decomposition does. Its
    fourteen ops (torch's: twenty-one) cost a ResNet-50's trace 53 times."""
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    scale = torch.rsqrt(var.to(compute) + eps)
    if weight is not None:
        scale = scale * weight.to(compute)
    shift = -mean.to(compute) * scale
    if bias is not None:
        shift = shift + bias.to(compute)
    shape = [x.shape[1]] + [1] * (x.dim() - 2)
    return (x * scale.view(shape) + shift.view(shape)).to(x.dtype)


def _batch_norm_in_eval(op: torch._ops.OpOverload) -> Callable:
    """`op` when it normalises with running statistics (eval mode): then it is pure pointwise
    math (`_eval_affine`), with the empty saved statistics ATen's eval mode returns. In
    training it also updates the running statistics in place; it stays whole there and
    functionalisation handles the update."""

    names = [a.name for a in op._schema.arguments]  # (input, weight, bias, running_mean,
    # running_var, training, momentum, eps), by whatever names this overload gives them

    def decomp(*args, **kwargs):
        bound = {**dict(zip(names, args)), **kwargs}
        x, weight, bias, mean, var, training = (bound.get(n) for n in names[:6])
        if training or mean is None or var is None:
            return NotImplemented
        out = _eval_affine(x, weight, bias, mean, var, bound[names[7]])
        if op == aten.cudnn_batch_norm.default:  # (out, save_mean, save_var, reserve)
            return (
                out,
                weight.new_zeros((0,)),
                weight.new_zeros((0,)),
                x.new_zeros((0,), dtype=torch.uint8),
            )
        return out, x.new_zeros((0,)), x.new_zeros((0,))

    return decomp


for _op in (aten.native_batch_norm.default, aten.cudnn_batch_norm.default):
    if _op in _TORCH_TABLE:  # (input, weight, bias, running_mean, running_var, training, ...)
        register(_op, why="batch norm in eval mode: pointwise math fused with its neighbours")(
            _batch_norm_in_eval(_op)
        )


def functionalization_repairs() -> dict[torch._ops.OpOverload, Callable]:
    """Decompositions the functional forward needs before autograd differentiates it:
    functionalisation turns `dst.copy_(src)` into `aten.copy`, which has no derivative."""
    return {aten.copy.default: _OWN[aten.copy.default]}


def _overloads(name: str) -> list:
    packet_name, _, overload = name.partition(".")
    packet = getattr(aten, packet_name)
    if overload:
        return [getattr(packet, overload)] if hasattr(packet, overload) else []
    return [getattr(packet, o) for o in packet.overloads()]


@functools.cache
def _table() -> tuple[dict, tuple[str, ...]]:
    table: dict = {}
    missing: list[str] = []
    own = {str(op).removeprefix("aten.") for op in _OWN}  # (named once, not once per name)
    for name in DECOMPOSED:
        if name in own:
            continue
        found = [op for op in _overloads(name) if op in _TORCH_TABLE]
        if not found:
            missing.append(name)
        for op in found:
            table[op] = _TORCH_TABLE[op]
    table.update(_OWN)
    return table, tuple(missing)


def default_decompositions() -> dict[torch._ops.OpOverload, Callable]:
    """kiln's table (a fresh dict each call, so callers may extend it)."""
    return dict(_table()[0])


def missing_decompositions() -> tuple[str, ...]:
    """Names in `DECOMPOSED` that this torch version has no decomposition for (skipped)."""
    return _table()[1]


def describe() -> str:
    """The table as text, one op a line with the reason: what `KILN_LOGS=aot_graphs` shows."""
    lines = [f"  {name:40s} {why}" for name, why in DECOMPOSED.items()]
    skipped = missing_decompositions()
    if skipped:
        lines.append(f"  (not in this torch, kept whole: {', '.join(skipped)})")
    return "\n".join(lines)


for _op, _fn in foreach_decompositions().items():
    register(_op, why=FOREACH_WHY)(_fn)
