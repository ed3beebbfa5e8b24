"""Reductions across rows (a column sum: a bias's or a norm weight's gradient) are planned as
tiles of neighbouring outputs that loop over the rows (heuristics._reduces_across_rows), and
compute what eager does; reductions along contiguous rows keep their plans."""

from __future__ import annotations

import pytest
import torch
from tr_helpers import TRITON_PROBLEM, check

from kiln.codegen.triton.heuristics import OUTER_XBLOCK

pytestmark = pytest.mark.skipif(bool(TRITON_PROBLEM), reason=TRITON_PROBLEM or "")


def _launches(compiled) -> list[str]:
    return [line.strip() for line in compiled.wrapper_source.splitlines() if "](" in line]


def test_column_sums_are_tiled_across_outputs():
    def fn(x):
        return (x.sum(0), x.pow(2).mean(0))

    c = check(fn, torch.randn(300, 40))
    (launch,) = _launches(c)
    assert f"XBLOCK={OUTER_XBLOCK}" in launch and "RBLOCK=128" in launch


def test_norm_backward_like_sums_both_ways():
    def fn(g, x, w):
        return ((g * x).sum(0), g.sum(0), (g * w).sum(-1))

    c = check(fn, torch.randn(257, 33), torch.randn(257, 33), torch.randn(33))
    across, along = _launches(c)
    assert f"XBLOCK={OUTER_XBLOCK}" in across and "RBLOCK=128" in across
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
