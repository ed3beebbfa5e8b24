"""Helpers for the Triton tests: skip without Triton, compile a function, compare with eager.

`check(fn, *example_inputs)` traces `fn` with `make_fx`, compiles it with
`kiln.codegen.triton.compile_graph_strict`, runs it on the example inputs and on fresh random
inputs of the same shapes, dtypes and strides, and compares every output with eager `fn`
(default `assert_close` tolerances). It returns the compiled graph, so a test can also assert
on the generated kernels (`.triton_source`) and wrapper (`.wrapper_source`).
"""

from __future__ import annotations

import importlib.util
import re

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
    from kiln.codegen.triton import compile_graph_strict

    gm = make_fx(fn)(*inputs)
    return compile_graph_strict(gm, list(inputs), options=options)


def check(fn, *inputs, fresh=True, options=None, compiled=None):
    compiled = compiled or compile_fn(fn, *inputs, options=options)
    runs = [inputs]
    if fresh:
        runs.append(tuple(fresh_like(x) if isinstance(x, torch.Tensor) else x for x in inputs))
    for args in runs:
        expected = pytree.tree_leaves(fn(*args))
        got = compiled(*args)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            if isinstance(e, torch.Tensor):
                assert g.dtype == e.dtype, (g.dtype, e.dtype)
                assert g.shape == e.shape, (g.shape, e.shape)
                assert g.device == e.device, (g.device, e.device)
                torch.testing.assert_close(g, e, equal_nan=True)
            else:
                assert g == e
    return compiled


def kernel_count(compiled) -> int:
    return len(re.findall(r"^def kernel\d+\(", compiled.triton_source, flags=re.M))


def kernel_source(compiled, name: str) -> str:
    src = compiled.triton_source
    start = src.index(f"def {name}(")
    end = src.find("\n@triton.jit", start)
    return src[start : end if end >= 0 else len(src)]
