"""lower/pooling.py: max_pool2d_with_indices as unrolled pointwise code, on the C++ path and on
Triton's interpreter, against eager on fresh random data (NaN, ties and -inf included)."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen import compile_graph_strict

CASES = [  # kernel, stride, padding, dilation, ceil_mode, input shape
    (3, 2, 1, 1, False, (2, 4, 9, 9)),
    (3, 2, 1, 1, True, (2, 3, 10, 7)),
    (2, 2, 0, 1, False, (1, 5, 8, 8)),
    ((3, 2), (1, 2), (1, 0), (2, 1), False, (2, 2, 11, 6)),
    (5, 3, 2, 1, True, (1, 2, 12, 13)),
]


def _data(shape, dtype=torch.float32, channels_last=False):
    x = torch.randn(shape).to(dtype)
    x[0, 0, 0, 0] = float("nan")
    x[-1, -1, 1:4, 1:4] = 0.5  # a window of ties: the first position wins
    x[0, -1, :, :2] = float("-inf")
    return x.to(memory_format=torch.channels_last) if channels_last else x


def _pool(k, s, p, d, ceil):
    def f(x):
        v, i = F.max_pool2d(x, k, s, p, d, ceil_mode=ceil, return_indices=True)
        return v, i

    return f


def _compare(compiled, f, x):
    v, i = compiled(x)
    ev, ei = f(x)
    torch.testing.assert_close(v, ev, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(i, ei), f"positions differ at {(i != ei).nonzero()[:4].tolist()}"


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("channels_last", [False, True])
def test_max_pool_matches_eager_on_cpp(case, channels_last):
    *params, shape = case
    f = _pool(*params)
    x = _data(shape, channels_last=channels_last)
    compiled = compile_graph_strict(make_fx(f)(x), [x])
    assert "max_pool2d" not in compiled.wrapper_source, "the pooling stayed an extern call"
    for _ in range(2):
        _compare(compiled, f, _data(shape, channels_last=channels_last))


def test_bf16_pool_after_batch_norm_stores_the_norm_then_pools():
    bn = torch.nn.BatchNorm2d(8).eval()
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 2)

    def f(x, m, v, w, b):
        y = torch.relu(F.batch_norm(x, m, v, w, b, False, 0.1, 1e-5))
        return (F.max_pool2d(y, 3, 2, 1),)

    args = [bn.running_mean, bn.running_var, torch.randn(8), torch.randn(8)]
    x = torch.randn(2, 8, 12, 12).to(torch.bfloat16).to(memory_format=torch.channels_last)
    args = [a.to(torch.bfloat16) for a in args]
    compiled = compile_graph_strict(make_fx(f)(x, *args), [x, *args])
    # the norm is stored once, not computed again at each of the 9 window positions
    assert compiled.kernel_count == 2, compiled.wrapper_source
    assert "max_pool2d" not in compiled.wrapper_source
    for _ in range(2):
        x = torch.randn(2, 8, 12, 12).to(torch.bfloat16).to(memory_format=torch.channels_last)
        (got,) = compiled(x, *args)
        (want,) = f(x, *args)
        torch.testing.assert_close(got, want)  # bf16 eager rounds after each op


def test_a_large_window_stays_an_extern_call():
    f = _pool(6, 1, 0, 1, False)
    x = torch.randn(1, 2, 10, 10)
    compiled = compile_graph_strict(make_fx(f)(x), [x])
    assert "max_pool2d_with_indices" in compiled.wrapper_source
    _compare(compiled, f, torch.randn(1, 2, 10, 10))


def test_max_pool_on_triton_interpreter():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "codegen", "triton"))
    from tr_helpers import TRITON_PROBLEM, compile_fn

    if TRITON_PROBLEM:
        pytest.skip(TRITON_PROBLEM)
    for case in CASES[:2] + CASES[3:4]:
        *params, shape = case
        f = _pool(*params)
        compiled = compile_fn(f, _data(shape, channels_last=True))
        _compare(compiled, f, _data(shape, channels_last=True))


def test_pooled_values_keep_eagers_channels_last_layout():
    """Both results of the multi-output lowering are stored in eager's memory order, so a
    convolution reading the pooled values gets them channels-last, as in eager."""

    def f(x, w):
        y = F.max_pool2d(torch.relu(x), 3, 2, 1)
        return (F.conv2d(y, w), y)

    x = torch.randn(2, 8, 12, 12).to(memory_format=torch.channels_last)
    w = torch.randn(4, 8, 1, 1).to(memory_format=torch.channels_last)
    compiled = compile_graph_strict(make_fx(f)(x, w), [x, w])
    for _ in range(2):
        x = torch.randn(2, 8, 12, 12).to(memory_format=torch.channels_last)
        got, want = compiled(x, w), f(x, w)
        assert got[1].stride() == want[1].stride()
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
