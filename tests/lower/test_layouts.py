"""Pointwise results are stored in eager's memory order (lower/layouts.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from kiln.lower.layouts import dense_order

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from cg_helpers import check  # noqa: E402


def test_dense_order_of_common_layouts():
    assert dense_order(torch.empty(2, 3, 4, 5)) is None  # row-major already
    assert dense_order(torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)) == (
        0,
        2,
        3,
        1,
    )
    assert dense_order(torch.empty(6, 7).t()) == (1, 0)
    assert dense_order(torch.empty(6, 1).expand(6, 4)) is None  # overlapping: not dense
    assert dense_order(torch.empty(6, 8)[:, ::2]) is None  # gaps: not dense
    # Size-1 dimensions stay where they are; the others follow their strides.
    t = torch.empty(3, 1, 5).permute(2, 1, 0)
    assert dense_order(t) == (2, 1, 0)


def test_channels_last_block_keeps_layout_and_converts_nothing():
    w1 = torch.randn(16, 8, 3, 3).to(memory_format=torch.channels_last)
    w2 = torch.randn(16, 16, 3, 3).to(memory_format=torch.channels_last)
    scale, shift = torch.rand(16) + 0.5, torch.randn(16)

    def block(x):
        y = F.conv2d(x, w1, padding=1)
        y = torch.relu(y * scale[:, None, None] + shift[:, None, None])
        y = F.conv2d(y, w2, padding=1)
        return (torch.relu(y + shift[:, None, None]),)

    x = torch.randn(2, 8, 10, 12).to(memory_format=torch.channels_last)
    c = check(block, x, rtol=1e-4, atol=1e-4)
    out = c(x)[0]
    assert out.stride() == block(x)[0].stride()  # channels-last, as eager gives it
    # Both fused kernels store N, H, W, C in order and hand the convolution a channels-last
    # view of that buffer (before, they stored N, C, H, W and every conv converted it back).
    assert c.wrapper_source.count("_empty((2, 10, 12, 16), (1920, 192, 16, 1)") >= 1
    # (the views: the second convolution's input and the result; the other `_as_strided` is
    # the second kernel's buffer taking the first's dead storage)
    views = re.findall(
        r"= _as_strided\(\w+, \(2, 16, 10, 12\), \(1920, 1, 192, 16\)\)", c.wrapper_source
    )
    assert len(views) == 2


def test_transposed_pointwise_matches_eager_strides():
    def fn(x):
        return ((x.t() * 2).sin() + 1,)

    x = torch.randn(9, 13)
    c = check(fn, x)
    assert c(x)[0].stride() == fn(x)[0].stride() == (1, 13)
