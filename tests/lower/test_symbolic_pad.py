"""A padding whose amount depends on a symbolic size lowers to a kernel when its sign is known for
every size (lower/symbolic.py `size_bounds`), instead of an ATen call.

Why it matters: `scaled_dot_product_attention` pads an attention bias to 16-byte rows
(`F.pad(bias, (0, 8 - n % 8))`), so every layer of a dynamic decode step on the GPU (float32 Llama,
memory-efficient attention) made a `constant_pad_nd` call, two launches and an allocation, because
the lowering could not decide `8 - ModularIndexing(s, 8) < 0`. Compared with eager on fresh
random data at several sizes, through the C++ path and Triton's interpreter.
"""

from __future__ import annotations

import math

import pytest
import sympy
import torch
import torch.nn.functional as F

import kiln
from kiln.lower.indexing import FloorDiv, ModularIndexing
from kiln.lower.symbolic import size_bounds
from kiln.runtime.triton_interpret import is_interpreting

s0 = sympy.Symbol("s0", integer=True, nonnegative=True)


def test_size_bounds_of_remainders_quotients_and_sums():
    assert size_bounds(8 - ModularIndexing(s0, 8)) == (1, 8)
    assert size_bounds(ModularIndexing(s0 + 1, 8) + 2 * s0) == (0, math.inf)
    assert size_bounds(FloorDiv(s0, 4)) == (0, math.inf)
    assert size_bounds(-s0) == (-math.inf, 0)
    assert size_bounds(s0 - ModularIndexing(s0, 8))[0] < 0  # true, but not provable this way
    assert size_bounds(sympy.Max(3 - ModularIndexing(s0, 4), 1)) == (1, 3)
    assert size_bounds(sympy.Symbol("u")) == (-math.inf, math.inf)  # no sign known
    assert size_bounds(5) == (5, 5)


def _masked(x, keep):
    n = keep.size(-1)
    bias = torch.where(keep, 0.0, -1e4)
    padded = F.pad(bias, (0, 8 - n % 8))  # rows to a multiple of 8, as sdpa pads its bias
    return x @ padded[..., :n].transpose(-1, -2), padded


@pytest.mark.parametrize("options", [None, {"codegen.device": "cuda"}], ids=["cpp", "triton"])
def test_symbolic_padding_is_a_kernel_and_matches_eager(perf_hints, options):
    if options and not is_interpreting():
        pytest.skip("Triton interpreter is off (a GPU run)")
    kiln.reset()
    compiled = kiln.compile(_masked, dynamic=True, options=options)
    for n in (11, 16, 21, 30):
        x, keep = torch.randn(3, n), torch.rand(4, n) > 0.4
        got, want = compiled(x, keep), _masked(x, keep)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w)
    externs = [m for m in perf_hints if "constant_pad_nd" in m]
    assert externs == []  # before: "extern call aten.constant_pad_nd.default: lowering needs..."


def test_padding_of_unknown_sign_stays_an_aten_call(perf_hints):
    def crop_or_pad(x):
        return F.pad(x, (0, 4 - x.size(-1) % 8))  # negative for some sizes

    kiln.reset()
    compiled = kiln.compile(crop_or_pad, dynamic=True)
    for n in (9, 13, 22):
        x = torch.randn(2, n)
        torch.testing.assert_close(compiled(x), crop_or_pad(x))
    assert any("constant_pad_nd" in m and "not provably nonnegative" in m for m in perf_hints)
