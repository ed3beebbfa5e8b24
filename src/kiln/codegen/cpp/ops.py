"""The C++ language tables: dtypes, scalar ops, constants and the prelude every kernel file has.

Takes loop-IR dtypes, op names and constants; gives C++ spellings (`CTYPES`, `OP_TEMPLATES`,
`render_const`) and `PRELUDE`, the helper functions with ATen's semantics (NaN-propagating
max/min, Python-style floor division and remainder, bf16/fp16 conversion with round-to-nearest-
even). At import it asserts that every op in `lower.ops.OPS` has a template here, so no lowering
can reach a renderer that cannot print it (STYLE.md items 4 and 5: language differences live in
tables, not in `if` chains in the passes).

Why it exists: the renderer is then just "walk the body, look the op up".
"""

from __future__ import annotations

import math

import torch

from ...lower.ops import OPS

# storage type of each dtype in memory, and its compute type in registers
CTYPES: dict[torch.dtype, str] = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "kiln::half",
    torch.bfloat16: "kiln::bf16",
    torch.int64: "int64_t",
    torch.int32: "int32_t",
    torch.int16: "int16_t",
    torch.int8: "int8_t",
    torch.uint8: "uint8_t",
    torch.bool: "bool",
}

HALF_TYPES = (torch.float16, torch.bfloat16)

OP_TEMPLATES: dict[str, str] = {
    "neg": "(-{0})",
    "abs": "kiln::abs_({0})",
    "exp": "std::exp({0})",
    "exp2": "std::exp2({0})",
    "expm1": "std::expm1({0})",
    "log": "std::log({0})",
    "log2": "std::log2({0})",
    "log10": "std::log10({0})",
    "log1p": "std::log1p({0})",
    "sqrt": "std::sqrt({0})",
    "rsqrt": "kiln::rsqrt({0})",
    "sin": "std::sin({0})",
    "cos": "std::cos({0})",
    "tan": "std::tan({0})",
    "asin": "std::asin({0})",
    "acos": "std::acos({0})",
    "atan": "std::atan({0})",
    "sinh": "std::sinh({0})",
    "cosh": "std::cosh({0})",
    "tanh": "std::tanh({0})",
    "asinh": "std::asinh({0})",
    "acosh": "std::acosh({0})",
    "atanh": "std::atanh({0})",
    "sigmoid": "kiln::sigmoid({0})",
    "erf": "std::erf({0})",
    "erfc": "std::erfc({0})",
    "lgamma": "std::lgamma({0})",
    "floor": "std::floor({0})",
    "ceil": "std::ceil({0})",
    "round": "std::nearbyint({0})",
    "trunc": "std::trunc({0})",
    "sign": "kiln::sign({0})",
    "reciprocal": "kiln::reciprocal({0})",
    "logical_not": "(!{0})",
    "bitwise_not": "kiln::bitwise_not({0})",
    "isnan": "kiln::isnan_({0})",
    "isinf": "std::isinf({0})",
    "frac": "({0} - std::trunc({0}))",
    "signbit": "std::signbit({0})",
    "to": "kiln::convert<{T}>({0})",
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "truediv": "({0} / {1})",
    "floordiv": "kiln::floordiv({0}, {1})",
    "truncdiv": "kiln::truncdiv({0}, {1})",
    "remainder": "kiln::remainder({0}, {1})",
    "fmod": "kiln::fmod_({0}, {1})",
    "pow": "kiln::pow_({0}, {1})",
    "maximum": "kiln::maximum({0}, {1})",
    "minimum": "kiln::minimum({0}, {1})",
    "fmax": "std::fmax({0}, {1})",
    "fmin": "std::fmin({0}, {1})",
    "atan2": "std::atan2({0}, {1})",
    "hypot": "std::hypot({0}, {1})",
    "copysign": "std::copysign({0}, {1})",
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
    "lt": "({0} < {1})",
    "le": "({0} <= {1})",
    "gt": "({0} > {1})",
    "ge": "({0} >= {1})",
    "logical_and": "({0} && {1})",
    "logical_or": "({0} || {1})",
    "logical_xor": "(bool({0}) != bool({1}))",
    "bitwise_and": "({0} & {1})",
    "bitwise_or": "({0} | {1})",
    "bitwise_xor": "({0} ^ {1})",
    "lshift": "kiln::lshift({0}, {1})",
    "rshift": "kiln::rshift({0}, {1})",
    "where": "({0} ? {1} : {2})",
}

_missing = set(OPS) - set(OP_TEMPLATES)
assert not _missing, f"C++ renderer lacks loop-IR ops: {sorted(_missing)}"

# reduction type -> (initial value spelling, combine statement on acc and v)
REDUCTION_INIT = {
    "sum": "0",
    "prod": "1",
    "max": "kiln::lowest<{T}>()",
    "min": "kiln::highest<{T}>()",
    "any": "false",
    "all": "true",
}
REDUCTION_COMBINE = {
    "sum": "{acc} = {acc} + {v};",
    "prod": "{acc} = {acc} * {v};",
    "max": "{acc} = kiln::maximum({acc}, {v});",
    "min": "{acc} = kiln::minimum({acc}, {v});",
    "any": "{acc} = {acc} || {v};",
    "all": "{acc} = {acc} && {v};",
}


def compute_ctype(dtype: torch.dtype) -> str:
    return "float" if dtype in HALF_TYPES else CTYPES[dtype]


def render_const(value, dtype: torch.dtype) -> str:
    t = compute_ctype(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(value):
            sign = "-" if value < 0 else ""
            return f"{sign}std::numeric_limits<{t}>::infinity()"
        return f"static_cast<{t}>({value.hex()})"
    value = int(value)
    if value == -(2**63):
        return "static_cast<int64_t>(-9223372036854775807LL - 1)"
    return f"static_cast<{t}>({value}LL)"


PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__x86_64__) && defined(__GLIBC__)
// glibc's libmvec has vector versions of these; declaring them lets `omp simd` loops call them.
#define KILN_SIMD1(fn) \
  __attribute__((__simd__("notinbranch"))) float fn##f(float) noexcept; \
  __attribute__((__simd__("notinbranch"))) double fn(double) noexcept;
#define KILN_SIMD2(fn) \
  __attribute__((__simd__("notinbranch"))) float fn##f(float, float) noexcept; \
  __attribute__((__simd__("notinbranch"))) double fn(double, double) noexcept;
extern "C" {
KILN_SIMD1(exp) KILN_SIMD1(log) KILN_SIMD1(sin) KILN_SIMD1(cos) KILN_SIMD2(pow)
#if __GLIBC_PREREQ(2, 35)  // the rest arrived in glibc 2.35
KILN_SIMD1(tanh) KILN_SIMD1(erf) KILN_SIMD1(erfc) KILN_SIMD1(expm1) KILN_SIMD1(log1p)
KILN_SIMD1(exp2) KILN_SIMD1(log2) KILN_SIMD1(log10) KILN_SIMD1(tan) KILN_SIMD1(sinh)
KILN_SIMD1(cosh) KILN_SIMD1(asin) KILN_SIMD1(acos) KILN_SIMD1(atan) KILN_SIMD1(asinh)
KILN_SIMD1(acosh) KILN_SIMD1(atanh) KILN_SIMD2(atan2) KILN_SIMD2(hypot)
#endif
}
#endif

namespace kiln {
typedef _Float16 half;
struct bf16 { uint16_t bits; };

static inline float load(float v) { return v; }
static inline double load(double v) { return v; }
static inline float load(half v) { return static_cast<float>(v); }
static inline float load(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16; float f; std::memcpy(&f, &u, 4); return f;
}
template <typename T> static inline T load(T v) { return v; }

template <typename S> struct Store {
  template <typename V> static S of(V v) { return static_cast<S>(v); }
};
template <> struct Store<half> { static half of(float v) { return static_cast<half>(v); } };
template <> struct Store<bf16> {
  static bf16 of(float v) {
    uint32_t u; std::memcpy(&u, &v, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>(0x7fc0)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16{static_cast<uint16_t>(u >> 16)};
  }
};

template <typename T, typename V> static inline T convert(V v) { return static_cast<T>(v); }

template <typename T> static inline bool isnan_(T v) {
  if constexpr (std::is_floating_point<T>::value) return std::isnan(v); else return false;
}
template <typename T> static inline T lowest() {
  if constexpr (std::is_floating_point<T>::value) return -std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::lowest();
}
template <typename T> static inline T highest() {
  if constexpr (std::is_floating_point<T>::value) return std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::max();
}
template <typename T> static inline T maximum(T a, T b) {
  if (isnan_(a)) return a; if (isnan_(b)) return b; return a > b ? a : b;
}
template <typename T> static inline T minimum(T a, T b) {
  if (isnan_(a)) return a; if (isnan_(b)) return b; return a < b ? a : b;
}
template <typename T> static inline T abs_(T a) {
  if constexpr (std::is_same<T, bool>::value) return a;
  else if constexpr (std::is_floating_point<T>::value) return std::fabs(a);
  else return a < 0 ? static_cast<T>(-a) : a;
}
template <typename T> static inline T rsqrt(T a) { return T(1) / std::sqrt(a); }
template <typename T> static inline T sigmoid(T a) { return T(1) / (T(1) + std::exp(-a)); }
template <typename T> static inline T reciprocal(T a) { return T(1) / a; }
template <typename T> static inline T sign(T a) {
  if constexpr (std::is_same<T, bool>::value) return a;
  else if constexpr (std::is_floating_point<T>::value) {
    if (std::isnan(a)) return 0;
    return static_cast<T>((T(0) < a) - (a < T(0)));
  }
  else return static_cast<T>((T(0) < a) - (a < T(0)));
}
template <typename T> static inline T bitwise_not(T a) {
  if constexpr (std::is_same<T, bool>::value) return !a; else return static_cast<T>(~a);
}
template <typename T> static inline T floordiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    if (b == 0) return a / b;
    T mod = std::fmod(a, b);
    T div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
    T fl;
    if (div != 0) { fl = std::floor(div); if (div - fl > T(0.5)) fl += T(1); }
    else fl = std::copysign(T(0), a / b);
    return fl;
  } else {
    if (b == 0) return 0;
    T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q;
  }
}
template <typename T> static inline T truncdiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return std::trunc(a / b);
  else { if (b == 0) return 0; return a / b; }
}
template <typename T> static inline T remainder(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) {
    T m = std::fmod(a, b); if (m != 0 && ((b < 0) != (m < 0))) m += b; return m;
  } else {
    if (b == 0) return 0; T m = a % b; if (m != 0 && ((b < 0) != (m < 0))) m += b; return m;
  }
}
template <typename T> static inline T fmod_(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return std::fmod(a, b);
  else { if (b == 0) return 0; return a % b; }
}
template <typename T> static inline T pow_(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) return std::pow(a, b);
  else if constexpr (std::is_same<T, bool>::value) return a || !b;
  else {
    if (b < 0) { if (a == 1) return 1; if (a == -1) return (b % 2) ? -1 : 1; return 0; }
    T r = 1; T base = a; while (b) { if (b & 1) r *= base; base *= base; b >>= 1; } return r;
  }
}
// An index read from memory, clamped into [0, size): a bad index reads a valid element and the
// graph's bounds check (kiln.check_index) raises eager's error; `wrap` counts negatives from
// the end first, as advanced indexing does.
static inline int64_t indirect(int64_t v, int64_t size) {
  return v < 0 ? 0 : (v >= size ? size - 1 : v);
}
static inline int64_t indirect_wrap(int64_t v, int64_t size) {
  return indirect(v < 0 ? v + size : v, size);
}
// 1 + erf(x) in float as ATen's vectorized GELU computes it (Abramowitz & Stegun 7.1.26:
// erfc(|x|) ~ t * P(t) * exp(-x * x), absolute error about 1.5e-7): a polynomial, a division
// and one exp, which an `omp simd` loop runs faster than libmvec's erf. Below zero the result
// is that erfc itself, so no precision is lost to `1 - 0.9999...` (the GELU of a negative x).
static inline float one_plus_erf(float x) {
  const float t = 1.0f / std::fma(0.3275911f, std::fabs(x), 1.0f);
  const float p = std::fma(std::fma(std::fma(std::fma(1.061405429f, t, -1.453152027f), t,
                  1.421413741f), t, -0.284496736f), t, 0.254829592f);
  const float c = p * t * std::exp(-x * x);
  return x < 0.0f ? c : 2.0f - c;
}
template <typename T> static inline T lshift(T a, T b) {
  if (b < 0 || b >= static_cast<T>(sizeof(T) * 8)) return 0;
  return static_cast<T>(static_cast<typename std::make_unsigned<T>::type>(a) << b);
}
template <typename T> static inline T rshift(T a, T b) {
  if (b < 0 || b >= static_cast<T>(sizeof(T) * 8)) return a < 0 ? T(-1) : T(0);
  return static_cast<T>(a >> b);
}
}  // namespace kiln
"""
