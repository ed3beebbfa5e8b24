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


def test_loops_between_a_softmax_sum_and_its_output_reuse_the_stored_exp():
    # softmax then layer norm over the same row (the softmax_ln benchmark): the mean's and the
    # variance's loops read the exp the softmax sum stored, instead of calling exp twice more.
    def fn(x, w, b):
        return F.layer_norm(torch.softmax(x / 8, -1) * 512, (x.shape[-1],), w, b) + x

    c = check(fn, torch.randn(6, 40, 96), torch.randn(96), torch.randn(96))
    (kernel,) = c.cpp_source.split('extern "C" void kernel')[1:]
    assert kernel.count("std::exp(") == 1
    assert kernel.count("acc_") >= 3  # max, sum, mean, variance: one kernel, one row loop
