"""Generated-code tests for the C++ fast paths: what the kernels must not contain (slow library
calls, copies) on the shapes the benchmark models hit, each also compared with eager on fresh
random inputs (cg_helpers.check).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from cg_helpers import check


def test_pow_by_small_constants_is_multiplication_not_powf():
    # glibc's vector powf takes a scalar path per lane for a negative base: GPT-2's tanh-GELU
    # (`x ** 3.0`) ran 25x slower than the multiplications ATen itself uses.
    def fn(x, y):
        pos = y.abs() + 0.5
        return (
            x**3.0,
            x**2,
            x**-1.0,
            x**-2,
            pos**0.5,
            pos**-0.5,
            F.gelu(x, approximate="tanh"),
        )

    compiled = check(fn, torch.randn(64, 300), torch.randn(64, 300))
    assert "kiln::pow_(" not in compiled.cpp_source


def test_pow_by_other_constants_still_calls_pow():
    compiled = check(lambda x: (x.abs() + 0.1) ** 2.5 + x**4, torch.randn(8, 40))
    assert "kiln::pow_(" in compiled.cpp_source
