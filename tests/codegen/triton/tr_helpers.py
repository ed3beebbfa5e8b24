"""Helpers for the Triton tests: skip without Triton, compile a function, compare with eager.

`check(fn, *example_inputs)` traces `fn` with `make_fx`, compiles it with
`kiln.codegen.compile_graph_strict` for the cuda device, runs it on the example inputs and on
fresh random inputs of the same shapes, dtypes and strides, and compares every output with
eager `fn` (`assert_matches_eager`). It returns the compiled graph, so a test can also assert on the
generated kernels (`.triton_source`) and wrapper (`.wrapper_source`).

How outputs are compared (`assert_matches_eager`), in the way mature compilers test fusions:

1. Integer and bool outputs must equal eager's exactly; floating outputs must have eager's NaN
   and infinity positions. A floating output that passes `torch.testing.assert_close` against
   eager at its default tolerances passes.
2. Otherwise kiln and eager did not round alike, which a correct kernel may do: a fused kernel
   keeps float32 values in registers where eager stores (and rounds) each op's result, and it
   sums in another order. One float ulp of difference in an intermediate can move a bfloat16
   result by one bfloat16 ulp, and layer norm divides that by the row's standard deviation. So
   both results are judged against a float64 reference, `fn` run on the same inputs upcast to
   float64, and kiln's largest error must be no worse than eager's:

       max|kiln - ref| <= FACTOR * max|eager - ref| + eps(dtype) * scale

   with FACTOR = 2, eps the output dtype's machine epsilon and `scale` the largest |ref| (at
   least 1) unless the test gives one. An error bigger than eager's — a missed intermediate
   rounding that eager does, a wrong index, a lost element — still fails: it is one wrong
   element's error against eager's worst, not a tolerance widened for every element.

   `check` takes step 2 for outputs on the GPU, and on the CPU when an input is half-typed: by
   default kiln keeps a fused kernel's intermediates in float32 where eager rounds each op's
   result to the half type (torch.compile does the same), so it is *closer* to float64 than
   eager, not equal to it. Under `options={"triton.emulate_precision_casts": True}` kiln rounds
   like eager, and the CPU interpreter's float32 arithmetic follows eager's closely enough that
   step 1 applies alone: that guard catches a rounding the renderer forgot to emulate.

   A reduction whose result cancels (a float32 sum of 77,100 random terms that comes to ~10)
   is known only to about eps * sum|terms| in any order; eager's own error there is one random
   sample, so such a test passes `scales=` naming that bound (the backward-error scale, still
   far below the change from one lost or doubled term).
"""

from __future__ import annotations

import importlib.util
import re
from functools import partial

import pytest
import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx


def _triton_problem() -> str | None:
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:  # tests/codegen/triton is a namespace, not Triton
        return "triton is not installed (pip install triton)"
    try:
        import triton.language  # noqa: F401
    except ImportError as e:
        return f"triton does not import: {e}"
    return None


TRITON_PROBLEM = _triton_problem()
if TRITON_PROBLEM:
    print(f"\nskipping Triton tests: {TRITON_PROBLEM}")


def require_interpreter():
    """Skip a CPU test unless Triton's interpreter is on (see conftest.py)."""
    if TRITON_PROBLEM:
        pytest.skip(TRITON_PROBLEM)
    from kiln.runtime.triton_interpret import is_interpreting

    if not is_interpreting():
        pytest.skip("Triton interpreter is off (a GPU run: use -m gpu)")


def require_gpu():
    """Skip a GPU test unless Triton can compile for a CUDA device (no interpreter)."""
    if TRITON_PROBLEM:
        pytest.skip(TRITON_PROBLEM)
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from kiln.runtime.triton_interpret import is_interpreting

    if is_interpreting():
        pytest.skip("TRITON_INTERPRET is set; GPU tests compile for the GPU (run with -m gpu)")


def fresh_like(t: torch.Tensor) -> torch.Tensor:
    """A new random tensor with `t`'s shape, dtype, strides and device (never zeros)."""
    if t.dtype == torch.bool:
        base = torch.rand(t.shape) > 0.5
    elif t.dtype.is_floating_point:
        base = torch.randn(t.shape, dtype=torch.float64).to(t.dtype)
    elif t.dtype == torch.uint8:
        base = torch.randint(0, 20, t.shape).to(t.dtype)
    else:
        base = torch.randint(-9, 10, t.shape).to(t.dtype)
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    out.copy_(base)
    return out


def compile_fn(fn, *inputs, options=None):
    from kiln.codegen import compile_graph_strict

    gm = make_fx(fn)(*inputs)
    return compile_graph_strict(gm, list(inputs), "cuda", options=options)


FACTOR = 2.0  # kiln's error may be this many times eager's (against the float64 reference)
HALF = (torch.float16, torch.bfloat16)


def check(fn, *inputs, fresh=True, options=None, compiled=None, scales=None):
    """Compile `fn`, run it on `inputs` (and fresh ones), compare each output with eager.

    `scales(*args) -> {output index: scale}` gives the error scale of outputs whose float
    accuracy is not relative to their own size (see the module doc); most tests give none.
    """
    compiled = compiled or compile_fn(fn, *inputs, options=options)
    emulated = bool(options and options.get("triton.emulate_precision_casts"))
    halves = any(isinstance(x, torch.Tensor) and x.dtype in HALF for x in inputs)
    runs = [inputs]
    if fresh:
        runs.append(tuple(fresh_like(x) if isinstance(x, torch.Tensor) else x for x in inputs))
    for args in runs:
        expected = pytree.tree_leaves(fn(*args))
        got = compiled(*args)
        assert len(got) == len(expected)
        reference = _Reference(fn, args)
        given = scales(*args) if scales is not None else {}
        for i, (g, e) in enumerate(zip(got, expected)):
            if isinstance(e, torch.Tensor):
                # an output with a named scale is judged by it (step 2) on the CPU too: its
                # accuracy is not relative to its own size, which is what step 1 assumes
                judged = e.device.type != "cpu" or (halves and not emulated) or i in given
                ref = partial(reference.output, i) if judged else None
                assert_matches_eager(g, e, ref, scale=given.get(i))
            else:
                assert g == e
    return compiled


class _Reference:
    """`fn` on the inputs upcast to float64, computed once and only when an output needs it."""

    def __init__(self, fn, args) -> None:
        self.fn, self.args, self.outputs = fn, args, None

    def output(self, i: int) -> torch.Tensor:
        if self.outputs is None:
            up = [_upcast(a) for a in self.args]
            self.outputs = pytree.tree_leaves(self.fn(*up))
        return self.outputs[i]


def _upcast(a):
    if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
        return a.detach().to(torch.float64)
    return a


def assert_matches_eager(got, expected, reference=None, *, scale=None, factor=FACTOR) -> None:
    """Assert kiln's output `got` is as good as eager's `expected` (module doc, steps 1 and 2).

    `reference` is the float64 reference of this output, or a callable giving it (computed
    only when step 2 needs it); without one, step 1 alone decides.
    """
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert got.device == expected.device, (got.device, expected.device)
    if not expected.dtype.is_floating_point:
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        return
    try:
        torch.testing.assert_close(got, expected, equal_nan=True)
        return
    except AssertionError as close_error:
        if reference is None:
            raise
        first = close_error
    ref = reference() if callable(reference) else reference
    g, e = got.double(), expected.double()
    ref = ref.to(device=g.device, dtype=torch.float64)
    # non-finite values are not rounding: kiln must have eager's NaNs and infinities
    torch.testing.assert_close(
        g.isnan(), e.isnan(), rtol=0, atol=0, msg="NaN positions differ from eager's"
    )
    inf = e.isinf()
    assert torch.equal(g.isinf(), inf) and torch.equal(g[inf], e[inf]), "infinities differ"
    finite = e.isfinite() & ref.isfinite()
    if not finite.any():
        return
    err_kiln = (g - ref)[finite].abs().max().item()
    err_eager = (e - ref)[finite].abs().max().item()
    if scale is None:
        scale = max(ref[finite].abs().max().item(), 1.0)
    scale = float(scale)
    eps = torch.finfo(expected.dtype).eps
    allowed = factor * err_eager + eps * scale
    if err_kiln > allowed:
        raise AssertionError(
            f"kiln's output is further from the float64 reference than eager's allows: "
            f"max error {err_kiln:.3g} > {factor:g} x eager's {err_eager:.3g} "
            f"+ eps {eps:.3g} x scale {scale:.3g} = {allowed:.3g}.\n"
            f"Against eager directly: {first}"
        )


def kernel_count(compiled) -> int:
    return len(re.findall(r"^def kernel\d+\(", compiled.triton_source, flags=re.M))


def kernel_source(compiled, name: str) -> str:
    src = compiled.triton_source
    start = src.index(f"def {name}(")
    end = src.find("\n@triton.jit", start)
    return src[start : end if end >= 0 else len(src)]
