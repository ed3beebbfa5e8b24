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


def _norm_backward_sums(g, x, m, r):
    """A layer norm's weight and bias gradients and a linear layer's bias gradient."""
    return ((g * ((x - m[:, None]) * r[:, None])).sum(0), g.sum(0), x.sum(0))


def _sum_scales(g, x, m, r):
    """Each sum is known to about eps x the sum of its terms' sizes, in any order."""
    norm = (x - m[:, None]) * r[:, None]
    return {0: (g * norm).abs().sum(0).max(), 1: g.abs().sum(0).max(), 2: x.abs().sum(0).max()}


def test_sums_over_many_rows_split_the_rows_among_programs():
    """Few outputs, many rows: each program adds a chunk of rows into a partial, and a second
    kernel adds the partials; the scratch buffers live only around the two launches."""
    args = (torch.randn(3000, 70), torch.randn(3000, 70), torch.randn(3000), torch.rand(3000))
    c = check(_norm_backward_sums, *args, scales=_sum_scales)
    main, finish = _launches(c)
    assert "](" in main and "_part, " in main and "partial sums of" in main
    grid = main.split("[", 1)[1].split("]", 1)[0]
    assert grid.count(",") == 1 and not grid.endswith(",)")  # (outputs' tiles, row chunks)
    assert finish.startswith("kernel0_sum[")
    lines = [ln.strip() for ln in c.wrapper_source.splitlines()]
    scratch = [ln for ln in lines if ln.endswith("torch.float32, device)") and "_part" in ln]
    freed = [ln for ln in lines if ln.startswith("del ") and ln.endswith("_part")]
    assert len(scratch) == len(freed) == 3


def test_half_precision_sums_split_with_float32_partials():
    args = [torch.randn(2048, 48).to(torch.bfloat16) for _ in range(2)]
    c = check(lambda a, b: ((a * b).sum(0), a.sum(0)), *args)
    (main, finish) = _launches(c)
    assert "kernel0_sum[" in finish
    assert "torch.float32, device)" in c.wrapper_source  # partials keep the compute type
    assert "_to_bf16(sum0)" in c.triton_source  # rounded once, after the partials are added


def test_only_plain_sums_split():
    """A maximum, and a sum that another member of its kernel reads (a column variance reads
    its column mean), stay whole-column: a program's partial is not the value they need."""
    x = torch.randn(2048, 40)
    c = check(lambda x: (x.amax(0),), x)
    assert not any("_sum[" in ln for ln in _launches(c))
    c = check(lambda x: (((x - x.mean(0)) ** 2).sum(0),), x)
    launches = _launches(c)
    assert len(launches) == 1 and "_sum[" not in launches[0], launches


def test_split_plan_choices():
    from kiln.codegen.triton.heuristics import _split_plan

    p = _split_plan(768, 8192)  # the layer norm backward of a GPT-2-small step
    assert (p.XBLOCK, p.RBLOCK) == (32, 64) and p.grid[0] == 24
    assert p.split * p.rchunk >= 8192 > (p.split - 1) * p.rchunk and p.rchunk % 64 == 0
    assert 24 * p.split >= 500
    wide = _split_plan(3072, 8192)  # a GPT-2 MLP's bias gradient: about 2048 programs
    assert wide.grid[0] == 96 and 96 * wide.split >= 2000 and wide.rchunk % 64 == 0
    assert _split_plan(8192, 4096) is None  # 256 tiles of outputs already fill the GPU
    assert _split_plan(40, 300) is None or _split_plan(40, 300).split >= 2
