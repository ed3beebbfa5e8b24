"""The Triton language tables: dtypes, scalar ops, constants, reductions and the helper prelude.

Takes loop-IR dtypes, op names and constants; gives Triton spellings (`TL_TYPES`,
`OP_TEMPLATES`, `render_const`, `REDUCTIONS`) and `PRELUDE`, the `@triton.jit` helpers with
ATen's semantics (NaN-propagating max/min, Python-style floor division and remainder, guarded
integer division, first-index argmax). At import it asserts that every op in `lower.ops.OPS`
has a template here, as the C++ tables do, so no lowering reaches a renderer that cannot print
it (STYLE.md items 4 and 5: language differences live in tables).

Math beyond Triton's core (`expm1`, `atan2`, `lgamma`, ...) goes through `libdevice`, which the
generated module imports by that name; under `TRITON_INTERPRET=1` the builder swaps in a
NumPy-backed stand-in (runtime/triton_interpret.py) so the same source runs on the CPU.

Why it exists: the renderer is then just "walk the body, look the op up".
"""

from __future__ import annotations

import math

import torch

from ...lower.ops import OPS

TL_TYPES: dict[torch.dtype, str] = {
    torch.float32: "tl.float32",
    torch.float64: "tl.float64",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.int64: "tl.int64",
    torch.int32: "tl.int32",
    torch.int16: "tl.int16",
    torch.int8: "tl.int8",
    torch.uint8: "tl.uint8",
    torch.bool: "tl.int1",
}
HALF_TYPES = (torch.float16, torch.bfloat16)
BITS = {torch.int64: 64, torch.int32: 32, torch.int16: 16, torch.int8: 8, torch.uint8: 8}

# op -> template over the rendered arguments {0}, {1}, {2}; {T} is the result's Triton type.
OP_TEMPLATES: dict[str, str] = {
    "neg": "(-{0})",
    "abs": "tl.abs({0})",
    "exp": "tl.exp({0})",
    "exp2": "tl.exp2({0})",
    "expm1": "libdevice.expm1({0})",
    "log": "tl.log({0})",
    "log2": "tl.log2({0})",
    "log10": "libdevice.log10({0})",
    "log1p": "libdevice.log1p({0})",
    "sqrt": "tl.sqrt_rn({0})",
    # eager's CUDA rsqrt is the hardware reciprocal square root (rsqrtf), as libdevice's is;
    # 1 / sqrt_rn (a correctly rounded root, then a division) cost a dozen-op chain 30%
    "rsqrt": "libdevice.rsqrt({0})",
    "sin": "tl.sin({0})",
    "cos": "tl.cos({0})",
    "tan": "libdevice.tan({0})",
    "asin": "libdevice.asin({0})",
    "acos": "libdevice.acos({0})",
    "atan": "libdevice.atan({0})",
    "sinh": "libdevice.sinh({0})",
    "cosh": "libdevice.cosh({0})",
    "tanh": "libdevice.tanh({0})",
    "asinh": "libdevice.asinh({0})",
    "acosh": "libdevice.acosh({0})",
    "atanh": "libdevice.atanh({0})",
    "sigmoid": "(1.0 / (1.0 + tl.exp(-{0})))",
    "erf": "tl.erf({0})",
    "erfc": "libdevice.erfc({0})",
    "lgamma": "libdevice.lgamma({0})",
    "floor": "tl.floor({0})",
    "ceil": "tl.ceil({0})",
    "round": "libdevice.nearbyint({0})",
    "trunc": "libdevice.trunc({0})",
    "sign": "_sign({0})",
    "reciprocal": "(1.0 / {0})",
    "logical_not": "({0} == 0)",
    "bitwise_not": "(~{0})",
    "isnan": "({0} != {0})",
    "isinf": "(tl.abs({0}) == float('inf'))",
    "frac": "({0} - libdevice.trunc({0}))",
    "signbit": "(libdevice.signbit({0}) != 0)",
    "to": "{0}.to({T})",
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "truediv": "({0} / {1})",
    "floordiv": "_floordiv_f({0}, {1})",
    "truncdiv": "libdevice.trunc({0} / {1})",
    "remainder": "_remainder_f({0}, {1})",
    "fmod": "libdevice.fmod({0}, {1})",
    "pow": "libdevice.pow({0}, {1})",
    "maximum": "_maximum({0}, {1})",
    "minimum": "_minimum({0}, {1})",
    "fmax": "_fmax({0}, {1})",
    "fmin": "_fmin({0}, {1})",
    "atan2": "libdevice.atan2({0}, {1})",
    "hypot": "libdevice.hypot({0}, {1})",
    "copysign": "libdevice.copysign({0}, {1})",
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
    "lt": "({0} < {1})",
    "le": "({0} <= {1})",
    "gt": "({0} > {1})",
    "ge": "({0} >= {1})",
    "logical_and": "(({0} != 0) & ({1} != 0))",
    "logical_or": "(({0} != 0) | ({1} != 0))",
    "logical_xor": "(({0} != 0) ^ ({1} != 0))",
    "bitwise_and": "({0} & {1})",
    "bitwise_or": "({0} | {1})",
    "bitwise_xor": "({0} ^ {1})",
    "lshift": "_lshift({0}, {1}, {bits})",
    "rshift": "_rshift({0}, {1}, {bits})",
    "where": "tl.where({0}, {1}, {2})",
}

# Integer (and bool) operands need other spellings: the overrides, by op.
INT_OVERRIDES: dict[str, str] = {
    "truediv": "_truncdiv_i({0}, {1})",
    "floordiv": "_floordiv_i({0}, {1})",
    "truncdiv": "_truncdiv_i({0}, {1})",
    "remainder": "_remainder_i({0}, {1})",
    "fmod": "_fmod_i({0}, {1})",
    "pow": "_pow_i({0}, {1})",
    "abs": "_abs_i({0})",
    "sign": "_sign_i({0})",
    "isinf": "({0} != {0})",
    "to": "{0}.to({T})",
}
BOOL_OVERRIDES: dict[str, str] = {
    "bitwise_not": "({0} == 0)",
    "abs": "{0}",
    "sign": "{0}",
    "neg": "{0}",
    "pow": "(({0} != 0) | ({1} == 0))",
}
# Conversions: to bool is a comparison; to a half type rounds and stays float32 (compute type).
# bfloat16 rounds to nearest even through the prelude's `_round_bf16` and is stored through
# `_to_bf16`: on a GPU both are the hardware conversion; in Triton's interpreter (which
# truncates) they are integer ops that round as the GPU does, so the tests see what runs.
TO_BOOL = "({0} != 0)"
TO_HALF = {torch.float16: "{0}.to(tl.float16).to(tl.float32)", torch.bfloat16: "_round_bf16({0})"}

_missing = set(OPS) - set(OP_TEMPLATES)
assert not _missing, f"Triton renderer lacks loop-IR ops: {sorted(_missing)}"


def op_template(op: str, arg_dtype: torch.dtype, out_dtype: torch.dtype) -> str:
    """The template of `op` applied to arguments of `arg_dtype`, giving `out_dtype`."""
    if op == "to":
        if out_dtype == torch.bool:
            return TO_BOOL
        if out_dtype in HALF_TYPES:
            return TO_HALF[out_dtype]
        return OP_TEMPLATES["to"]
    if arg_dtype == torch.bool and op in BOOL_OVERRIDES:
        return BOOL_OVERRIDES[op]
    if not arg_dtype.is_floating_point and op in INT_OVERRIDES:
        return INT_OVERRIDES[op]
    return OP_TEMPLATES[op]


def store_cast(dtype: torch.dtype) -> str:
    """Template of the conversion of a computed value `{0}` to the storage type `dtype`."""
    if dtype == torch.bfloat16:
        return "_to_bf16({0})"
    return "{0}.to(%s)" % TL_TYPES[dtype]


def compute_tl(dtype: torch.dtype) -> str:
    return "tl.float32" if dtype in HALF_TYPES else TL_TYPES[dtype]


def render_const(value, dtype: torch.dtype) -> str:
    """A Python literal Triton reads as `dtype`'s compute type (used inside `tl.full`)."""
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('-inf')" if value < 0 else "float('inf')"
        return repr(value)
    return str(int(value))


# reduction type -> (identity for masked lanes as a Python literal by kind, combine spelling)
# "{v}" is the [XBLOCK, RBLOCK] block, "{ax}" the axis; results keep the axis (keep_dims).
REDUCE_IDENTITY = {
    "sum": {"float": "0.0", "int": "0"},
    "prod": {"float": "1.0", "int": "1"},
    "max": {"float": "float('-inf')", "int": "{lowest}"},
    "min": {"float": "float('inf')", "int": "{highest}"},
    "any": {"float": "0", "int": "0"},
    "all": {"float": "1", "int": "1"},
}
REDUCE_BLOCK = {
    "sum": "tl.sum({v}, 1, keep_dims=True)",
    "prod": "tl.reduce({v}, 1, _prod_combine, keep_dims=True)",
    "max": "tl.reduce({v}, 1, _maximum, keep_dims=True)",
    "min": "tl.reduce({v}, 1, _minimum, keep_dims=True)",
    "any": "(tl.max({v}.to(tl.int8), 1, keep_dims=True) != 0)",
    "all": "(tl.min({v}.to(tl.int8), 1, keep_dims=True) != 0)",
}
# elementwise accumulation for looped reductions: acc = combine(acc, v)
REDUCE_ACCUMULATE = {
    "sum": "{acc} + {v}",
    "prod": "{acc} * {v}",
    "max": "_maximum({acc}, {v})",
    "min": "_minimum({acc}, {v})",
    "any": "({acc} | ({v} != 0))",
    "all": "({acc} & ({v} != 0))",
}
INT_LIMITS = {
    torch.int64: (-(2**63), 2**63 - 1),
    torch.int32: (-(2**31), 2**31 - 1),
    torch.int16: (-(2**15), 2**15 - 1),
    torch.int8: (-128, 127),
    torch.uint8: (0, 255),
    torch.bool: (0, 1),
}


def reduce_identity(rtype: str, dtype: torch.dtype) -> str:
    """The value masked-out lanes take so they do not change a `rtype` reduction."""
    if rtype in ("argmax", "argmin"):
        rtype = "max" if rtype == "argmax" else "min"
    kind = "float" if dtype.is_floating_point else "int"
    lo, hi = INT_LIMITS.get(dtype, (0, 0))
    return REDUCE_IDENTITY[rtype][kind].format(lowest=lo, highest=hi)


def prelude(interpret: bool) -> str:
    """The module's imports and `@triton.jit` helpers; `interpret`: for Triton's interpreter."""
    return PRELUDE.replace("{BF16}", BF16_INTERPRETED if interpret else BF16_COMPILED)


# float32 -> bfloat16 conversions. Compiled, the hardware's (round to nearest even): the
# integer version below cost 10-15% of a GELU kernel's time on the H200 (12.6M elements:
# 20.4 against 17.6 us) for identical results. Interpreted, the integer version: NumPy truncates.
BF16_COMPILED = """
@triton.jit
def _round_bf16(x):
    # float32 -> the nearest bfloat16, kept in float32
    return x.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _to_bf16(x):
    return x.to(tl.bfloat16)
"""
BF16_INTERPRETED = """
@triton.jit
def _round_bf16(x):
    # float32 -> the nearest bfloat16 (ties to even), kept in float32; NaN stays NaN
    u = x.to(tl.uint32, bitcast=True)
    u = u + 0x7FFF + ((u >> 16) & 1)
    r = ((u >> 16) << 16).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, r)


@triton.jit
def _to_bf16(x):
    return _round_bf16(x).to(tl.bfloat16)
"""

PRELUDE = """
import triton
import triton.language as tl
from triton.language.extra import libdevice

{BF16}


@triton.jit
def _maximum(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def _minimum(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def _fmax(a, b):
    return tl.where((a > b) | (b != b), a, b)


@triton.jit
def _fmin(a, b):
    return tl.where((a < b) | (b != b), a, b)


@triton.jit
def _prod_combine(a, b):
    return a * b


@triton.jit
def _argmax_combine(a, ai, b, bi):
    a_nan = a != a
    b_nan = b != b
    first = ai < bi
    take_a = (a > b) | (a_nan & ~b_nan) | ((a == b) & first) | (a_nan & b_nan & first)
    return tl.where(take_a, a, b), tl.where(take_a, ai, bi)


@triton.jit
def _argmin_combine(a, ai, b, bi):
    a_nan = a != a
    b_nan = b != b
    first = ai < bi
    take_a = (a < b) | (a_nan & ~b_nan) | ((a == b) & first) | (a_nan & b_nan & first)
    return tl.where(take_a, a, b), tl.where(take_a, ai, bi)


@triton.jit
def _sign(a):
    return (a > 0).to(a.dtype) - (a < 0).to(a.dtype)


@triton.jit
def _sign_i(a):
    return (a > 0).to(a.dtype) - (a < 0).to(a.dtype)


@triton.jit
def _abs_i(a):
    return tl.where(a < 0, -a, a)


@triton.jit
def _floordiv_f(a, b):
    mod = libdevice.fmod(a, b)
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    fl = tl.where(div == 0, libdevice.copysign(div * 0.0, a / b), fl)
    return tl.where(b == 0, a / b, fl)


@triton.jit
def _remainder_f(a, b):
    m = libdevice.fmod(a, b)
    return tl.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)


@triton.jit
def _truncdiv_i(a, b):
    safe = tl.where(b == 0, 1, b)
    q = a // safe
    return tl.where(b == 0, 0, q)


@triton.jit
def _floordiv_i(a, b):
    safe = tl.where(b == 0, 1, b)
    q = a // safe
    r = a % safe
    q = tl.where((r != 0) & ((a < 0) != (safe < 0)), q - 1, q)
    return tl.where(b == 0, 0, q)


@triton.jit
def _remainder_i(a, b):
    safe = tl.where(b == 0, 1, b)
    m = a % safe
    m = tl.where((m != 0) & ((safe < 0) != (m < 0)), m + safe, m)
    return tl.where(b == 0, 0, m)


@triton.jit
def _fmod_i(a, b):
    safe = tl.where(b == 0, 1, b)
    return tl.where(b == 0, 0, a % safe)


@triton.jit
def _pow_i(a, b):
    # every loop-carried value has the broadcast shape of (a, b) from the start
    base = a + b * 0
    result = base * 0 + 1
    e = tl.where(b < 0, 0, b) + a * 0
    for _ in range(64):
        result = tl.where((e & 1) != 0, result * base, result)
        base = base * base
        e = e >> 1
    neg = tl.where(a == 1, 1, tl.where(a == -1, tl.where((b & 1) != 0, -1, 1), 0))
    return tl.where(b < 0, neg.to(a.dtype), result)


@triton.jit
def _lshift(a, b, bits: tl.constexpr):
    ok = (b >= 0) & (b < bits)
    return tl.where(ok, a << tl.where(ok, b, 0), 0)


@triton.jit
def _rshift(a, b, bits: tl.constexpr):
    ok = (b >= 0) & (b < bits)
    return tl.where(ok, a >> tl.where(ok, b, 0), tl.where(a < 0, -1, 0).to(a.dtype))
"""
