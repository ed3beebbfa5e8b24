"""Lowerings of elementwise ATen ops: math, comparisons, `where`, casts, `clamp`, activations.

Takes ATen calls (through the registry); gives one `Pointwise` node each. Broadcasting and type
promotion come from `LoweringContext.elementwise`: the output dtype is the fake tensor's, the
computation runs in that dtype (float32 for float16/bfloat16 storage), comparisons compute in
the promoted type of their inputs.

Why it exists: these are the ops the scheduler fuses into chains; every activation is written
as a few primitive `ops` so the renderers stay small.
"""

from __future__ import annotations

import math

import torch

from . import ops
from .ir import compute_dtype
from .ops import const, op, where
from .registry import Unsupported, register_lowering

_UNARY = {
    "neg": "neg", "abs": "abs", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log",
    "log2": "log2", "log10": "log10", "log1p": "log1p", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan",
    "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "asinh": "asinh", "acosh": "acosh",
    "atanh": "atanh", "sigmoid": "sigmoid", "erf": "erf", "erfc": "erfc", "floor": "floor",
    "ceil": "ceil", "trunc": "trunc", "sign": "sign", "reciprocal": "reciprocal",
    "bitwise_not": "bitwise_not", "frac": "frac", "lgamma": "lgamma", "sgn": "sign",
    "fix": "trunc",
}  # fmt: skip

_BINARY = {
    "atan2": "atan2", "hypot": "hypot", "copysign": "copysign", "fmax": "fmax", "fmin": "fmin",
    "maximum": "maximum", "minimum": "minimum", "bitwise_and": "bitwise_and",
    "bitwise_or": "bitwise_or", "bitwise_xor": "bitwise_xor",
    "bitwise_left_shift": "lshift", "bitwise_right_shift": "rshift",
    "__lshift__": "lshift", "__rshift__": "rshift",
}  # fmt: skip

_COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
_LOGICAL = ("logical_and", "logical_or", "logical_xor")


def _unary(name: str):
    def lower(ctx, x):
        if name in ("floor", "ceil", "trunc", "frac") and not ctx.out_dtype.is_floating_point:
            return ctx.elementwise([x], lambda a: a)
        return ctx.elementwise([x], lambda a: op(name, a))

    return lower


for _aten, _op in _UNARY.items():
    register_lowering(f"{_aten}.default")(_unary(_op))


def _binary(name: str):
    return lambda ctx, a, b: ctx.elementwise([a, b], lambda x, y: op(name, x, y))


for _aten, _op in _BINARY.items():
    _names = [f"{_aten}.{o}" for o in ("Tensor", "Scalar", "default", "Tensor_Scalar")]
    for _n in _names:
        _packet, _, _over = _n.partition(".")
        if _over in getattr(torch.ops.aten, _packet).overloads():
            register_lowering(_n)(_binary(_op))


@register_lowering("round.default")
def _round(ctx, x):
    if not ctx.out_dtype.is_floating_point:
        return ctx.elementwise([x], lambda a: a)
    return ctx.elementwise([x], lambda a: op("round", a))


@register_lowering("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar")
def _add_sub(ctx, a, b, alpha=1):
    name = "add" if "add" in str(ctx.op) else "sub"

    def fn(x, y):
        if alpha != 1:
            y = ops.mul(y, const(alpha, y.dtype))
        if ctx.out_dtype == torch.bool:
            return op("logical_or" if name == "add" else "logical_xor", x, y)
        return op(name, x, y)

    return ctx.elementwise([a, b], fn)


@register_lowering("rsub.Tensor", "rsub.Scalar")
def _rsub(ctx, a, b, alpha=1):
    return ctx.elementwise(
        [a, b], lambda x, y: ops.sub(y, x if alpha == 1 else ops.mul(x, const(alpha, x.dtype)))
    )


@register_lowering("mul.Tensor", "mul.Scalar")
def _mul(ctx, a, b):
    if ctx.out_dtype == torch.bool:
        return ctx.elementwise([a, b], lambda x, y: op("logical_and", x, y))
    return ctx.elementwise([a, b], ops.mul)


@register_lowering("div.Tensor", "div.Scalar", "true_divide.Tensor")
def _div(ctx, a, b):
    return ctx.elementwise([a, b], ops.div)


@register_lowering("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(ctx, a, b, rounding_mode=None):
    name = {None: "truediv", "floor": "floordiv", "trunc": "truncdiv"}[rounding_mode]
    return ctx.elementwise([a, b], lambda x, y: op(name, x, y))


@register_lowering("floor_divide.default", "floor_divide.Scalar")
def _floor_divide(ctx, a, b):
    return ctx.elementwise([a, b], lambda x, y: op("floordiv", x, y))


@register_lowering("remainder.Tensor", "remainder.Scalar", "fmod.Tensor", "fmod.Scalar")
def _remainder(ctx, a, b):
    name = "remainder" if "remainder" in str(ctx.op) else "fmod"
    return ctx.elementwise([a, b], lambda x, y: op(name, x, y))


@register_lowering("pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar")
def _pow(ctx, a, b):
    if not isinstance(b, bool) and isinstance(b, (int, float)):
        special = _pow_special(b, ctx.out_dtype.is_floating_point)
        if special is not None:
            return ctx.elementwise([a], special)
    return ctx.elementwise([a, b], lambda x, y: op("pow", x, y))


def _pow_special(b, floating: bool):
    """`x ** b` as multiplications or a root for the exponents ATen's own pow kernel rewrites
    the same way (so results match eager's), else None. A vector `powf` is no substitute: glibc's
    takes a scalar path per lane for a negative base, and GPT-2's `x ** 3.0` in tanh-GELU then
    cost 25 times the whole rest of its kernel."""
    if b == 1:
        return lambda x: x
    if b == 2:
        return lambda x: ops.mul(x, x)
    if b == 3:
        return lambda x: ops.mul(ops.mul(x, x), x)
    if not floating:
        return None
    return {
        0.5: lambda x: op("sqrt", x),
        -0.5: lambda x: op("rsqrt", x),
        -1: lambda x: op("reciprocal", x),
        -2: lambda x: op("reciprocal", ops.mul(x, x)),
    }.get(b)


def _compare(name: str):
    def lower(ctx, a, b):
        return ctx.elementwise([a, b], lambda x, y: op(name, x, y), compute=ctx.promote(a, b))

    return lower


for _name in _COMPARE:
    register_lowering(f"{_name}.Tensor", f"{_name}.Scalar")(_compare(_name))


def _logical(name: str):
    return lambda ctx, a, b: ctx.elementwise(
        [a, b], lambda x, y: op(name, x, y), compute=torch.bool
    )


for _name in _LOGICAL:
    register_lowering(f"{_name}.default")(_logical(_name))


@register_lowering("logical_not.default")
def _logical_not(ctx, a):
    return ctx.elementwise([a], lambda x: op("logical_not", x), compute=torch.bool)


@register_lowering("isnan.default", "isinf.default", "signbit.default")
def _predicate(ctx, a):
    name = str(ctx.op).split(".")[1]
    if not ctx.dtype(a).is_floating_point:
        value = False
        return ctx.elementwise([a], lambda x: const(value, torch.bool), compute=torch.bool)
    return ctx.elementwise([a], lambda x: op(name, x), compute=ctx.dtype(a))


@register_lowering("isfinite.default")
def _isfinite(ctx, a):
    if not ctx.dtype(a).is_floating_point:
        return ctx.elementwise([a], lambda x: const(True, torch.bool), compute=torch.bool)

    def fn(x):
        bad = op("logical_or", op("isnan", x), op("isinf", x))
        return op("logical_not", bad)

    return ctx.elementwise([a], fn, compute=ctx.dtype(a))


@register_lowering("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(ctx, cond, a, b):
    size, out_dtype = ctx.out_size, ctx.out_dtype
    compute = compute_dtype(out_dtype)
    c = ctx.broadcast_load(cond, size, torch.bool)
    x = ctx.broadcast_load(a, size, compute)
    y = ctx.broadcast_load(b, size, compute)
    return ctx.pointwise(size, out_dtype, where(c, x, y))


@register_lowering("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(ctx, x, mask, value):
    return ctx.elementwise([mask, value, x], lambda m, v, a: where(ops.cast(m, torch.bool), v, a))


@register_lowering("clamp.default", "clamp.Tensor")
def _clamp(ctx, x, min=None, max=None):  # noqa: A002 - ATen's argument names
    args = [x] + [v for v in (min, max) if v is not None]

    def fn(a, *bounds):
        k = 0
        if min is not None:
            a, k = op("maximum", a, bounds[0]), 1
        if max is not None:
            a = op("minimum", a, bounds[k])
        return a

    return ctx.elementwise(args, fn)


@register_lowering("clamp_min.default", "clamp_min.Tensor")
def _clamp_min(ctx, x, lo):
    return ctx.elementwise([x, lo], lambda a, b: op("maximum", a, b))


@register_lowering("clamp_max.default", "clamp_max.Tensor")
def _clamp_max(ctx, x, hi):
    return ctx.elementwise([x, hi], lambda a, b: op("minimum", a, b))


@register_lowering("_to_copy.default", "clone.default", "lift_fresh_copy.default")
def _to_copy(ctx, x, **kwargs):
    device = kwargs.get("device")
    if device is not None and not ctx.on_graph_device(torch.device(device)):
        raise Unsupported(f"copy to device {device}, not the graph's {ctx.device}")
    if kwargs.get("layout") not in (None, torch.strided):
        raise Unsupported(f"copy to layout {kwargs['layout']}")
    return ctx.elementwise([x], lambda a: a)


@register_lowering("copy.default")
def _copy(ctx, dst, src, non_blocking=False):
    return ctx.elementwise([src], lambda a: a)


# ---------------------------------------------------------------------------------------------
# Activations (written with primitive ops; float compute)
# ---------------------------------------------------------------------------------------------


def _f(v, like):
    return const(v, like.dtype)


@register_lowering("relu.default")
def _relu(ctx, x):
    return ctx.elementwise([x], lambda a: op("maximum", a, _f(0, a)))


@register_lowering("silu.default")
def _silu(ctx, x):
    return ctx.elementwise([x], lambda a: ops.mul(a, op("sigmoid", a)))


@register_lowering("gelu.default")
def _gelu(ctx, x, approximate="none"):
    def fn(a):
        half = ops.mul(a, _f(0.5, a))
        if approximate == "tanh":
            inner = ops.mul(a, ops.add(_f(1, a), ops.mul(_f(0.044715, a), ops.mul(a, a))))
            t = op("tanh", ops.mul(_f(math.sqrt(2 / math.pi), a), inner))
            return ops.mul(half, ops.add(_f(1, a), t))
        e = op("erf", ops.mul(a, _f(math.sqrt(0.5), a)))
        return ops.mul(half, ops.add(_f(1, a), e))

    return ctx.elementwise([x], fn)


@register_lowering("hardtanh.default")
def _hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return ctx.elementwise(
        [x], lambda a: op("minimum", op("maximum", a, _f(min_val, a)), _f(max_val, a))
    )


@register_lowering("leaky_relu.default")
def _leaky_relu(ctx, x, negative_slope=0.01):
    return ctx.elementwise(
        [x], lambda a: where(op("gt", a, _f(0, a)), a, ops.mul(a, _f(negative_slope, a)))
    )


@register_lowering("elu.default")
def _elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    def fn(a):
        neg = ops.mul(_f(alpha, a), op("expm1", ops.mul(a, _f(input_scale, a))))
        return ops.mul(where(op("gt", a, _f(0, a)), a, neg), _f(scale, a))

    return ctx.elementwise([x], fn)


@register_lowering("softplus.default")
def _softplus(ctx, x, beta=1.0, threshold=20.0):
    def fn(a):
        ax = ops.mul(a, _f(beta, a))
        soft = ops.div(op("log1p", op("exp", ax)), _f(beta, a))
        return where(op("gt", ax, _f(threshold, a)), a, soft)

    return ctx.elementwise([x], fn)


@register_lowering("hardsigmoid.default")
def _hardsigmoid(ctx, x):
    def fn(a):
        t = op("minimum", op("maximum", ops.add(a, _f(3, a)), _f(0, a)), _f(6, a))
        return ops.div(t, _f(6, a))

    return ctx.elementwise([x], fn)


@register_lowering("hardswish.default")
def _hardswish(ctx, x):
    def fn(a):
        t = op("minimum", op("maximum", ops.add(a, _f(3, a)), _f(0, a)), _f(6, a))
        return ops.div(ops.mul(a, t), _f(6, a))

    return ctx.elementwise([x], fn)


@register_lowering("mish.default")
def _mish(ctx, x):
    def fn(a):
        sp = where(op("gt", a, _f(20, a)), a, op("log1p", op("exp", a)))
        return ops.mul(a, op("tanh", sp))

    return ctx.elementwise([x], fn)


@register_lowering("threshold.default")
def _threshold(ctx, x, threshold, value):
    return ctx.elementwise([x], lambda a: where(op("le", a, _f(threshold, a)), _f(value, a), a))


@register_lowering("threshold_backward.default")
def _threshold_backward(ctx, grad, x, threshold):
    return ctx.elementwise(
        [grad, x], lambda g, a: where(op("le", a, _f(threshold, a)), _f(0, g), g)
    )


@register_lowering("sigmoid_backward.default")
def _sigmoid_backward(ctx, grad, y):
    return ctx.elementwise([grad, y], lambda g, s: ops.mul(g, ops.mul(s, ops.sub(_f(1, s), s))))


@register_lowering("tanh_backward.default")
def _tanh_backward(ctx, grad, y):
    return ctx.elementwise([grad, y], lambda g, t: ops.mul(g, ops.sub(_f(1, t), ops.mul(t, t))))


@register_lowering("lerp.Scalar", "lerp.Tensor")
def _lerp(ctx, a, b, w):
    def fn(x, y, t):
        small = op("lt", op("abs", t), _f(0.5, t))
        lo = ops.add(x, ops.mul(t, ops.sub(y, x)))
        hi = ops.sub(y, ops.mul(ops.sub(y, x), ops.sub(_f(1, t), t)))
        return where(small, lo, hi)

    return ctx.elementwise([a, b, w], fn)


@register_lowering("addcmul.default", "addcdiv.default")
def _addc(ctx, x, t1, t2, value=1):
    name = "mul" if "addcmul" in str(ctx.op) else "truediv"
    return ctx.elementwise(
        [x, t1, t2], lambda a, b, c: ops.add(a, ops.mul(_f(value, a), op(name, b, c)))
    )


@register_lowering("nan_to_num.default")
def _nan_to_num(ctx, x, nan=0.0, posinf=None, neginf=None):
    info = torch.finfo(ctx.out_dtype) if ctx.out_dtype.is_floating_point else None
    if info is None:
        return ctx.elementwise([x], lambda a: a)
    pos = info.max if posinf is None else posinf
    neg = info.min if neginf is None else neginf

    def fn(a):
        a2 = where(op("isnan", a), _f(nan, a), a)
        inf = op("isinf", a)
        a3 = where(op("logical_and", inf, op("gt", a, _f(0, a))), _f(pos, a), a2)
        return where(op("logical_and", inf, op("lt", a, _f(0, a))), _f(neg, a), a3)

    return ctx.elementwise([x], fn)
