"""NumPy functions and array methods written as torch calls: the models numpy_trace.py runs.

Takes a NumPy name (a ufunc's, a module function's or an ndarray method's), the call's
arguments with every traced array replaced by its backing tensor, and `od`, the torch dtype
NumPy's own result has (numpy_trace.py runs NumPy on the real values first, so the dtype is
NumPy's, NEP 50 promotion included, without kiln restating NumPy's rules); gives the result as
a tensor computed by torch calls, which the recording mode puts into the graph. Operands are
cast to the dtype NumPy computes in before the torch call, so torch's own promotion never
decides a result's dtype. Anything a model does not cover raises `Unmodelled` (the reason a
graph break reports); a model that is wrong is caught by numpy_trace.py's comparison with
NumPy's result, never returned.
"""

from __future__ import annotations

import operator
from typing import Any

import torch


class Unmodelled(Exception):
    """The call (or this use of its arguments) has no torch model; the message says which."""


# ufuncs of one operand: NumPy name -> torch function
UNARY = {
    "sin": torch.sin,
    "cos": torch.cos,
    "tan": torch.tan,
    "arcsin": torch.asin,
    "arccos": torch.acos,
    "arctan": torch.atan,
    "sinh": torch.sinh,
    "cosh": torch.cosh,
    "tanh": torch.tanh,
    "arcsinh": torch.asinh,
    "arccosh": torch.acosh,
    "arctanh": torch.atanh,
    "exp": torch.exp,
    "exp2": torch.exp2,
    "expm1": torch.expm1,
    "log": torch.log,
    "log2": torch.log2,
    "log10": torch.log10,
    "log1p": torch.log1p,
    "sqrt": torch.sqrt,
    "cbrt": lambda t: torch.sign(t) * torch.abs(t) ** (1.0 / 3.0),
    "square": torch.square,
    "reciprocal": torch.reciprocal,
    "absolute": torch.abs,
    "fabs": torch.abs,
    "negative": torch.neg,
    "positive": torch.positive,
    "sign": torch.sign,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "trunc": torch.trunc,
    "rint": torch.round,
    "isnan": torch.isnan,
    "isinf": torch.isinf,
    "isfinite": torch.isfinite,
    "signbit": torch.signbit,
    "logical_not": torch.logical_not,
    "invert": torch.bitwise_not,
    "deg2rad": torch.deg2rad,
    "rad2deg": torch.rad2deg,
}
# ufuncs of two operands
BINARY = {
    "add": torch.add,
    "subtract": torch.sub,
    "multiply": torch.mul,
    "divide": torch.true_divide,
    "true_divide": torch.true_divide,
    "floor_divide": torch.floor_divide,
    "remainder": torch.remainder,
    "mod": torch.remainder,
    "fmod": torch.fmod,
    "power": torch.pow,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "fmax": torch.fmax,
    "fmin": torch.fmin,
    "arctan2": torch.atan2,
    "hypot": torch.hypot,
    "copysign": torch.copysign,
    "logaddexp": torch.logaddexp,
    "equal": torch.eq,
    "not_equal": torch.ne,
    "less": torch.lt,
    "less_equal": torch.le,
    "greater": torch.gt,
    "greater_equal": torch.ge,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor,
    "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor,
    "left_shift": torch.bitwise_left_shift,
    "right_shift": torch.bitwise_right_shift,
    "matmul": torch.matmul,
}
# ufuncs whose result is bool while they compute in their operands' common dtype
PREDICATES = {
    "isnan",
    "isinf",
    "isfinite",
    "signbit",
    "logical_not",
    "equal",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "logical_and",
    "logical_or",
    "logical_xor",
}
# Python operators on arrays: the ufunc each one is
OPERATORS = {
    operator.add: "add",
    operator.sub: "subtract",
    operator.mul: "multiply",
    operator.truediv: "true_divide",
    operator.floordiv: "floor_divide",
    operator.mod: "remainder",
    operator.pow: "power",
    operator.matmul: "matmul",
    operator.and_: "bitwise_and",
    operator.or_: "bitwise_or",
    operator.xor: "bitwise_xor",
    operator.lshift: "left_shift",
    operator.rshift: "right_shift",
    operator.lt: "less",
    operator.le: "less_equal",
    operator.eq: "equal",
    operator.ne: "not_equal",
    operator.gt: "greater",
    operator.ge: "greater_equal",
    operator.neg: "negative",
    operator.pos: "positive",
    operator.invert: "invert",
    operator.abs: "absolute",
}
INPLACE = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod,
    operator.ipow: operator.pow,
    operator.iand: operator.and_,
    operator.ior: operator.or_,
    operator.ixor: operator.xor,
    operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift,
}
ALIASES = {"abs": "absolute", "amax": "max", "amin": "min", "concat": "concatenate"}


def ufunc(name: str, args: tuple, kwargs: dict, od: torch.dtype, cd: torch.dtype):
    """`np.<name>(*args)`: operands cast to `cd` (the dtype NumPy computes in), result `od`."""
    for k in kwargs:
        if k != "dtype":
            raise Unmodelled(f"numpy.{name} with {k}=")
    fn = UNARY.get(name)
    if fn is not None and len(args) == 1:
        return fn(_cast(args[0], cd)).to(od)
    fn = BINARY.get(name)
    if fn is None or len(args) != 2:
        raise Unmodelled(f"numpy.{name} with {len(args)} operands")
    a, b = (_cast(x, cd) for x in args)
    if name == "matmul" and not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        raise Unmodelled("numpy.matmul of a scalar")
    return fn(a, b).to(od)


def _cast(x, dtype: torch.dtype):
    """A tensor in `dtype`; a Python number as a 0-d tensor of it (NumPy's weak scalar: it
    takes the array's dtype, as NEP 50 says, which `dtype` already is)."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype)
    if isinstance(x, (bool, int, float)):
        return torch.full((), x, dtype=dtype)
    raise Unmodelled(f"an operand of type {type(x).__name__}")


def _dims(a: torch.Tensor, axis) -> tuple[int, ...]:
    n = a.dim()
    if axis is None:
        return tuple(range(n))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(operator.index(d) % max(n, 1) for d in axes)


def _plain_reduction(kwargs: dict, name: str) -> None:
    for k in ("out", "where", "initial"):
        if kwargs.get(k) is not None:
            raise Unmodelled(f"numpy.{name} with {k}=")


def reduction(name: str, a: torch.Tensor, args: tuple, kwargs: dict, od: torch.dtype):
    """sum/prod/mean/max/min/std/var/all/any/argmax/argmin with NumPy's argument names."""
    names = ("axis", "dtype", "out", "keepdims") if name not in ("max", "min") else ()
    if name in ("max", "min", "all", "any"):
        names = ("axis", "out", "keepdims")
    elif name in ("argmax", "argmin"):
        names = ("axis", "out")
    elif name in ("std", "var"):
        names = ("axis", "dtype", "out", "ddof", "keepdims")
    if len(args) > len(names):
        raise Unmodelled(f"numpy.{name} with {len(args)} positional arguments")
    kw = dict(zip(names, args))
    kw.update(kwargs)
    _plain_reduction(kw, name)
    for k in kw:
        if k not in ("axis", "dtype", "out", "keepdims", "ddof"):
            raise Unmodelled(f"numpy.{name} with {k}=")
    axis, keep = kw.get("axis"), bool(kw.get("keepdims", False))
    if name in ("argmax", "argmin"):
        fn = torch.argmax if name == "argmax" else torch.argmin
        if axis is None:
            return fn(a)
        return fn(a, dim=_dims(a, axis)[0], keepdim=keep)
    dims = _dims(a, axis)
    if name in ("all", "any"):
        fn = torch.all if name == "all" else torch.any
        t = a
        for d in sorted(dims, reverse=True):
            t = fn(t, dim=d, keepdim=keep)
        return t.to(od)
    if name in ("sum", "mean", "prod", "std", "var"):
        a = a.to(od)
    if a.dim() == 0:
        return a.clone() if name not in ("std", "var") else _moments(name, a, (), kw, keep)
    if name == "sum":
        return torch.sum(a, dim=dims, keepdim=keep)
    if name == "mean":
        return torch.mean(a, dim=dims, keepdim=keep)
    if name == "prod":
        t = a
        for d in sorted(dims, reverse=True):
            t = torch.prod(t, dim=d, keepdim=keep)
        return t
    if name == "max":
        return torch.amax(a, dim=dims, keepdim=keep)
    if name == "min":
        return torch.amin(a, dim=dims, keepdim=keep)
    return _moments(name, a, dims, kw, keep)


def _moments(name: str, a: torch.Tensor, dims: tuple, kw: dict, keep: bool):
    fn = torch.std if name == "std" else torch.var
    return fn(a, dim=dims or None, correction=kw.get("ddof", 0), keepdim=keep)


REDUCTIONS = {"sum", "mean", "prod", "max", "min", "std", "var", "all", "any", "argmax", "argmin"}


def _shape_arg(args: tuple) -> Any:
    if len(args) == 1:
        return args[0]
    return tuple(args)


def call(name: str, args: tuple, kwargs: dict, od: torch.dtype, method: bool) -> Any:
    """`np.<name>(*args, **kwargs)` (or `args[0].<name>(*args[1:])` if `method`)."""
    name = ALIASES.get(name, name)
    if name in REDUCTIONS:
        return reduction(name, _tensor(args[0], name), args[1:], kwargs, od)
    impl = _FUNCS.get(name)
    if impl is None:
        raise Unmodelled(f"numpy.{name} is not modelled")
    return impl(args, kwargs, od, method)


def modelled(name: str) -> bool:
    """Is `np.<name>` / `ndarray.<name>` one of the calls `call` models?"""
    name = ALIASES.get(name, name)
    return name in REDUCTIONS or name in _FUNCS


def _tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise Unmodelled(f"numpy.{name} of a {type(x).__name__}")
    return x


def _no_kwargs(name: str, kwargs: dict, allowed=()) -> None:
    for k in kwargs:
        if k not in allowed:
            raise Unmodelled(f"numpy.{name} with {k}=")


def _reshape(args, kwargs, od, method):
    _no_kwargs("reshape", kwargs, ("order", "shape", "newshape"))
    if kwargs.get("order", "C") != "C":
        raise Unmodelled("numpy.reshape with order other than 'C'")
    shape = kwargs.get("shape", kwargs.get("newshape"))
    if shape is None:
        shape = _shape_arg(args[1:]) if method else args[1]
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return torch.reshape(_tensor(args[0], "reshape"), shape)


def _transpose(args, kwargs, od, method):
    _no_kwargs("transpose", kwargs, ("axes",))
    a = _tensor(args[0], "transpose")
    axes = kwargs.get("axes")
    if axes is None and len(args) > 1:
        axes = _shape_arg(args[1:]) if method else args[1]
    if axes is None:
        axes = tuple(reversed(range(a.dim())))
    return a.permute(tuple(axes))


def _swapaxes(args, kwargs, od, method):
    _no_kwargs("swapaxes", kwargs)
    return torch.transpose(_tensor(args[0], "swapaxes"), args[1], args[2])


def _moveaxis(args, kwargs, od, method):
    _no_kwargs("moveaxis", kwargs)
    return torch.movedim(_tensor(args[0], "moveaxis"), args[1], args[2])


def _ravel(args, kwargs, od, method):
    _no_kwargs("ravel", kwargs)
    return torch.reshape(_tensor(args[0], "ravel"), (-1,))


def _flatten(args, kwargs, od, method):
    _no_kwargs("flatten", kwargs)
    return torch.reshape(_tensor(args[0], "flatten"), (-1,)).clone()


def _squeeze(args, kwargs, od, method):
    _no_kwargs("squeeze", kwargs, ("axis",))
    a = _tensor(args[0], "squeeze")
    axis = kwargs.get("axis", args[1] if len(args) > 1 else None)
    if axis is None:
        return torch.squeeze(a)
    return torch.squeeze(a, _dims(a, axis))


def _expand_dims(args, kwargs, od, method):
    _no_kwargs("expand_dims", kwargs, ("axis",))
    a = _tensor(args[0], "expand_dims")
    axis = kwargs.get("axis", args[1] if len(args) > 1 else None)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    n = a.dim() + len(axes)
    for d in sorted(operator.index(x) % n for x in axes):
        a = torch.unsqueeze(a, d)
    return a


def _joined(name: str, args, kwargs, od, stack: bool):
    _no_kwargs(name, kwargs, ("axis", "dtype"))
    seq = args[0]
    if not isinstance(seq, (list, tuple)) or not seq:
        raise Unmodelled(f"numpy.{name} of a {type(seq).__name__}")
    axis = kwargs.get("axis", args[1] if len(args) > 1 else 0)
    parts = [_cast(_tensor(x, name), od) for x in seq]
    if stack:
        return torch.stack(parts, dim=axis)
    if axis is None:
        return torch.cat([p.reshape(-1) for p in parts])
    return torch.cat(parts, dim=axis)


def _where(args, kwargs, od, method):
    _no_kwargs("where", kwargs)
    if len(args) != 3:
        raise Unmodelled("numpy.where with one argument (its size depends on the data)")
    cond = args[0]
    cond = cond.to(torch.bool) if isinstance(cond, torch.Tensor) else bool(cond)
    if not isinstance(cond, torch.Tensor):
        raise Unmodelled("numpy.where of a Python condition")
    return torch.where(cond, _cast(args[1], od), _cast(args[2], od))


def _clip(args, kwargs, od, method):
    _no_kwargs("clip", kwargs, ("a_min", "a_max", "min", "max"))
    a = _tensor(args[0], "clip").to(od)
    lo = kwargs.get("a_min", kwargs.get("min", args[1] if len(args) > 1 else None))
    hi = kwargs.get("a_max", kwargs.get("max", args[2] if len(args) > 2 else None))
    lo = lo.to(od) if isinstance(lo, torch.Tensor) else lo
    hi = hi.to(od) if isinstance(hi, torch.Tensor) else hi
    if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
        lo = _cast(lo, od) if lo is not None else None
        hi = _cast(hi, od) if hi is not None else None
    return torch.clamp(a, lo, hi)


def _astype(args, kwargs, od, method):
    _no_kwargs("astype", kwargs, ("dtype", "copy", "casting"))
    a = _tensor(args[0], "astype")
    if kwargs.get("casting", "unsafe") != "unsafe":
        raise Unmodelled("astype with casting=")
    out = a.to(od)
    if out is a and kwargs.get("copy", True):
        out = a.clone()
    return out


def _copy(args, kwargs, od, method):
    _no_kwargs("copy", kwargs, ("order",))
    return _tensor(args[0], "copy").clone()


def _round(args, kwargs, od, method):
    _no_kwargs("round", kwargs, ("decimals",))
    a = _tensor(args[0], "round")
    decimals = kwargs.get("decimals", args[1] if len(args) > 1 else 0)
    if not a.is_floating_point():
        if decimals < 0:
            raise Unmodelled("numpy.round of integers to negative decimals")
        return a.clone()
    return torch.round(a, decimals=decimals)


def _cumulative(name: str):
    fn = torch.cumsum if name == "cumsum" else torch.cumprod

    def impl(args, kwargs, od, method):
        _no_kwargs(name, kwargs, ("axis", "dtype"))
        a = _tensor(args[0], name).to(od)
        axis = kwargs.get("axis", args[1] if len(args) > 1 else None)
        if axis is None:
            return fn(a.reshape(-1), 0)
        return fn(a, axis)

    return impl


def _dot(args, kwargs, od, method):
    _no_kwargs("dot", kwargs)
    a, b = (_tensor(x, "dot") for x in args[:2])
    if a.dim() > 2 or b.dim() > 2:
        raise Unmodelled("numpy.dot of arrays with more than 2 dimensions")
    return torch.matmul(a.to(od), b.to(od))


def _like(fill):
    def impl(args, kwargs, od, method):
        _no_kwargs("zeros_like", kwargs, ("dtype",))
        a = _tensor(args[0], "zeros_like")
        if fill == "full":
            return torch.full_like(a, args[1], dtype=od)
        return (torch.zeros_like if fill == 0 else torch.ones_like)(a, dtype=od)

    return impl


def _conversion(args, kwargs, od, method):
    """np.asarray/np.array/np.float32(...) of a traced value: the same data in NumPy's dtype."""
    _no_kwargs("asarray", kwargs, ("dtype", "copy"))
    a = _tensor(args[0], "asarray")
    return a.to(od)


_FUNCS = {
    "reshape": _reshape,
    "transpose": _transpose,
    "permute_dims": _transpose,
    "swapaxes": _swapaxes,
    "moveaxis": _moveaxis,
    "ravel": _ravel,
    "flatten": _flatten,
    "squeeze": _squeeze,
    "expand_dims": _expand_dims,
    "concatenate": lambda a, k, od, m: _joined("concatenate", a, k, od, False),
    "stack": lambda a, k, od, m: _joined("stack", a, k, od, True),
    "where": _where,
    "clip": _clip,
    "astype": _astype,
    "copy": _copy,
    "round": _round,
    "around": _round,
    "cumsum": _cumulative("cumsum"),
    "cumprod": _cumulative("cumprod"),
    "dot": _dot,
    "zeros_like": _like(0),
    "ones_like": _like(1),
    "full_like": _like("full"),
    "asarray": _conversion,
    "array": _conversion,
    "ascontiguousarray": _conversion,
}
