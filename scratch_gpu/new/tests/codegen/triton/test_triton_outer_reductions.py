"""Reductions across rows (a column sum: a bias's or a norm weight's gradient) are planned as
tiles of neighbouring outputs that loop over the rows (heuristics._reduces_across_rows), and
compute what eager does; reductions along contiguous rows keep their plans."""

from __future__ import annotations

import pytest
import torch
from tr_helpers import TRITON_PROBLEM, check

from kiln.codegen.triton.heuristics import outer_blocks

pytestmark = pytest.mark.skipif(bool(TRITON_PROBLEM), reason=TRITON_PROBLEM or "")


def _launches(compiled) -> list[str]:
    return [line.strip() for line in compiled.wrapper_source.splitlines() if "](" in line]


def test_column_sums_are_tiled_across_outputs():
    def fn(x):
        return (x.sum(0), x.pow(2).mean(0))

    c = check(fn, torch.randn(300, 40))
    (launch,) = _launches(c)
    xb, rb, warps = outer_blocks(40, 300)
    assert f"XBLOCK={xb}, RBLOCK={rb}, num_warps={warps}" in launch


def test_norm_backward_like_sums_both_ways():
    def fn(g, x, w):
        return ((g * x).sum(0), g.sum(0), (g * w).sum(-1))

    c = check(fn, torch.randn(257, 33), torch.randn(257, 33), torch.randn(33))
    across, along = _launches(c)
    xb, rb, warps = outer_blocks(33, 257)
    assert f"XBLOCK={xb}, RBLOCK={rb}, num_warps={warps}" in across
    assert "XBLOCK=32, RBLOCK=64" in along  # rows of 33 contiguous elements: persistent


def test_a_column_sum_feeding_a_pointwise_consumer():
    def fn(x):
        s = x.sum(0, keepdim=True)
        return (x / (s + 100.0), s)

    check(fn, torch.randn(129, 70))


def test_half_precision_column_sum():
    def fn(x):
        return (x.sum(0), x.amax(0))

    check(fn, torch.randn(512, 96).to(torch.bfloat16))


def test_few_outputs_get_narrow_tiles_of_many_rows():
    """A layer norm's weight gradient over 8192 x 768: 96 programs of 8 outputs, not 24 of 32
    (H200: 76 against 190 us); wide ones keep 32-output tiles; a short reduction stays short."""
    assert outer_blocks(768, 8192) == (8, 256, 8)
    assert outer_blocks(8192, 4096) == (32, 128, 4)
    assert outer_blocks(40, 300) == (8, 256, 8)
    assert outer_blocks(40, 100) == (8, 128, 2)
