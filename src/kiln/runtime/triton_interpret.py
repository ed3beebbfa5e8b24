"""A NumPy stand-in for Triton's `libdevice`, so generated kernels run under `TRITON_INTERPRET=1`.

Takes nothing; gives `libdevice`, a namespace with the libdevice functions kiln's Triton ops
table uses (`expm1`, `atan2`, `lgamma`, `nearbyint`, ...). Each applies the NumPy (or `math`)
function to the interpreter's block data and wraps the result as a Triton tensor of the
argument's element type, broadcasting as Triton would.

`scalar_loop_bounds()` fixes one interpreter quirk: a kernel's integer argument is a one-element
array there, and `range(0, s0, RBLOCK)` (a loop over a row whose length is a size argument)
asks NumPy 2 for `int()` of it, which NumPy refuses for arrays that are not 0-dimensional.

Why it exists: Triton's interpreter runs `tl.*` on NumPy but leaves `libdevice` calls (extern
functions) unimplemented. The builder swaps this namespace in for the generated module's
`libdevice` global only when interpreting, so the kernel source is the same one the GPU
compiles; the CPU tests then check kiln's rendering, not a second spelling of it.
"""

from __future__ import annotations

import math
from types import SimpleNamespace


def make_libdevice() -> SimpleNamespace:
    """The namespace (module doc). NumPy is imported here, not when kiln imports this module:
    NumPy is Triton's interpreter's dependency, not kiln's."""
    import numpy as np

    def _tensor_parts():
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        return tl, TensorHandle

    def _apply(np_fn, *args):
        tl, TensorHandle = _tensor_parts()
        like = next(a for a in args if isinstance(a, tl.core.tensor))
        datas = [a.handle.data if isinstance(a, tl.core.tensor) else a for a in args]
        dtype = like.handle.data.dtype
        with np.errstate(all="ignore"):
            out = np.asarray(np_fn(*datas)).astype(dtype)
        scalar = like.type.scalar
        ty = tl.core.block_type(scalar, list(out.shape)) if out.shape else scalar
        return tl.core.tensor(TensorHandle(out, scalar), ty)

    def _unary(np_fn):
        return lambda x, **_: _apply(np_fn, x)

    def _binary(np_fn):
        return lambda x, y, **_: _apply(np_fn, x, y)

    def _vectorized(fn):
        return np.vectorize(fn, otypes=[np.float64])

    def _lgamma(v: float) -> float:
        try:
            return math.lgamma(v)
        except (ValueError, OverflowError):  # poles at 0, -1, -2, ...
            return math.inf

    def _signbit(x):
        return np.signbit(x).astype(np.int32)

    libdevice = SimpleNamespace(
        expm1=_unary(np.expm1),
        log10=_unary(np.log10),
        log1p=_unary(np.log1p),
        tan=_unary(np.tan),
        asin=_unary(np.arcsin),
        acos=_unary(np.arccos),
        atan=_unary(np.arctan),
        sinh=_unary(np.sinh),
        cosh=_unary(np.cosh),
        tanh=_unary(np.tanh),
        rsqrt=_unary(lambda x: 1.0 / np.sqrt(x)),
        asinh=_unary(np.arcsinh),
        acosh=_unary(np.arccosh),
        atanh=_unary(np.arctanh),
        erfc=_unary(_vectorized(math.erfc)),
        lgamma=_unary(_vectorized(_lgamma)),
        nearbyint=_unary(np.rint),
        trunc=_unary(np.trunc),
        signbit=_unary(_signbit),
        fmod=_binary(np.fmod),
        pow=_binary(np.power),
        atan2=_binary(np.arctan2),
        hypot=_binary(np.hypot),
        copysign=_binary(np.copysign),
    )

    return libdevice


_FIXED: list = []


def scalar_loop_bounds() -> None:
    """Let the interpreter's scalars be loop bounds (module doc); once a process. Triton
    patches its tensor type per kernel run (`_patch_lang_tensor`); this wraps that patch."""
    if _FIXED:
        return
    _FIXED.append(True)
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:  # another Triton: nothing to fix, or nothing known to fix it
        return

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch


def is_interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (`TRITON_INTERPRET=1`, read by Triton)."""
    import triton

    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    return bool(getattr(runtime, "interpret", False))
