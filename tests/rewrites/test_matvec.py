"""rewrites/matvec.py: a one-row `mm` (a batch-1 decode step's linear layer) becomes a float32
reduction that the Triton path fuses into its neighbours' kernels; every other product stays a
cuBLAS call. The rewritten graphs compute what the originals do, on fresh random data."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from tr_helpers import assert_matches_eager, check, require_interpreter

from kiln.rewrites import matvec

aten = torch.ops.aten


def _mms(gm) -> int:
    return sum(n.target is aten.mm.default for n in gm.graph.nodes)


def _decode_linears(x, wq, wk, w_out):
    h = F.linear(x, wq) * F.linear(x, wk).sigmoid()
    return F.linear(h, w_out)


def _inputs(dtype, k=48, n=40):
    g = torch.Generator().manual_seed(0)
    shapes = ((1, k), (n, k), (n, k), (k, n))
    return tuple(torch.randn(s, generator=g).to(dtype) for s in shapes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_linear_layers_become_float32_reductions(dtype):
    args = _inputs(dtype)
    gm = make_fx(_decode_linears)(*args)
    assert _mms(gm) == 3
    assert matvec.matvec_reductions(gm, args) == 3
    assert _mms(gm) == 0
    sums = [n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList]
    assert len(sums) == 3 and all(n.meta["val"].dtype == torch.float32 for n in sums)
    for _ in range(2):
        fresh = tuple(torch.randn_like(a, dtype=torch.float32).to(dtype) for a in args)
        got, want = gm(*fresh), _decode_linears(*fresh)
        assert got.is_contiguous()
        # the products are summed in another order than eager's matmul (and in bf16 in float32,
        # rounded once, as cuBLAS's are): judged against float64 as tr_helpers judges kernels
        exact = _decode_linears(*(a.double() for a in fresh))
        assert_matches_eager(got, want, exact)


def test_products_that_stay_matmuls(monkeypatch):
    two_rows = _inputs(torch.float32)
    two_rows = (torch.randn(2, 48),) + two_rows[1:]
    gm = make_fx(_decode_linears)(*two_rows)
    assert matvec.matvec_reductions(gm, two_rows) == 0  # a real matrix product

    def row_major(x, w):  # w [K, N] row-major: each output would read a strided column
        return x @ w

    args = (torch.randn(1, 48), torch.randn(48, 40))
    gm = make_fx(row_major)(*args)
    assert matvec.matvec_reductions(gm, args) == 0

    monkeypatch.setattr(matvec, "MAX_WEIGHTS", 40 * 48 - 1)  # a weight past the bound
    args = _inputs(torch.float32)
    gm = make_fx(_decode_linears)(*args)
    assert matvec.matvec_reductions(gm, args) == 0


def test_symbolic_sizes_stay_matmuls():
    """A product whose sizes are known only per call keeps cuBLAS (its size bound and layout
    could not be judged once for every call)."""
    from cg_helpers import trace_dynamic

    args = _inputs(torch.float32)
    gm = trace_dynamic(_decode_linears, args, {0: [1], 1: [1], 2: [1], 3: [0]})
    mms = [n for n in gm.graph.nodes if n.target is aten.mm.default]
    assert len(mms) == 3 and isinstance(mms[0].args[1].meta["val"].shape[0], torch.SymInt)
    assert matvec.matvec_reductions(gm, args) == 0


def _rms_block(x, norm_w, wq, wk, wv, w_gate, w_up, w_down):
    """A batch-1 decoder step's linear layers around an RMS norm (no attention)."""
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_w
    q, k, v = F.linear(h, wq), F.linear(h, wk), F.linear(h, wv)
    mixed = x + q * k.sigmoid() + v
    return mixed + F.linear(F.silu(F.linear(mixed, w_gate)) * F.linear(mixed, w_up), w_down)


@pytest.mark.usefixtures("_interpreter")
def test_a_decode_block_calls_no_matmul_and_matches_eager():
    d, ff = 64, 96
    shapes = ((1, 1, d), (d,), (d, d), (d, d), (d, d), (ff, d), (ff, d), (d, ff))
    args = [torch.randn(s) / (s[-1] ** 0.5 if len(s) == 2 else 1) for s in shapes]
    # the products sum in another order than eager's matmuls: both are judged against float64
    c = check(_rms_block, *args, scales=lambda *a: {0: None})
    calls = re.findall(r"= (aten_\w+)\(", c.wrapper_source)
    assert calls == []  # every product is a reduction in a kernel; before: six aten_mm calls
    # q, k and v share one kernel, as do the gate and up products
    assert len(re.findall(r"^\s*kernel\d+\[", c.wrapper_source, flags=re.M)) <= 5


@pytest.fixture
def _interpreter():
    require_interpreter()
