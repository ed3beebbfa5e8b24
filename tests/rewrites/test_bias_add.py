"""rewrites/bias_add.py: `addmm` whose product only pointwise ops read becomes `mm` + `add` (the
add fuses into the reader, cuBLAS runs its plain matmul); any other reader keeps the `addmm`.
The rewritten graph computes what the original does, on fresh random data."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from kiln.rewrites.bias_add import unfuse_bias_adds

aten = torch.ops.aten


def _targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _traced(fn, *inputs):
    return make_fx(fn, tracing_mode="fake")(*inputs)


def _layouts(gm) -> dict:
    return {
        n.name: (tuple(v.shape), tuple(v.stride()), v.dtype)
        for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(v := n.meta.get("val"), torch.Tensor)
    }


def _check(fn, inputs, expect_rewrites: int):
    gm = _traced(fn, *inputs)
    assert aten.addmm.default in _targets(gm)
    assert unfuse_bias_adds(gm) == expect_rewrites
    kept = _layouts(gm)  # the rewrite's own `val`s: what propagating again gives
    FakeTensorProp(gm, FakeTensorMode()).propagate(*inputs)
    assert _layouts(gm) == kept
    fresh = [torch.randn_like(x) for x in inputs]
    torch.testing.assert_close(gm(*fresh), fn(*fresh), rtol=1e-5, atol=1e-5)
    return gm


def test_linear_then_gelu_loses_its_addmm():
    def fn(x, w, b):
        return F.gelu(F.linear(x, w, b))

    gm = _check(fn, [torch.randn(16, 32), torch.randn(24, 32), torch.randn(24)], 1)
    assert aten.addmm.default not in _targets(gm) and aten.mm.default in _targets(gm)


def test_linear_on_3d_input_is_seen_through_its_views():
    def fn(x, w, b, r):
        return F.linear(x, w, b) + r  # view(addmm(b, view(x), t(w))) + r

    inputs = [torch.randn(2, 8, 32), torch.randn(24, 32), torch.randn(24), torch.randn(2, 8, 24)]
    gm = _check(fn, inputs, 1)
    assert aten.addmm.default not in _targets(gm)


def test_addmm_read_by_anything_else_stays():
    def returned(x, w, b):
        return F.linear(x, w, b)

    def matmul_after(x, w, b, w2):
        return F.linear(x, w, b) @ w2

    def both(x, w, b):
        y = F.linear(x, w, b)
        return y.relu(), y  # a pointwise reader and the graph's output

    x, w, b = torch.randn(16, 32), torch.randn(24, 32), torch.randn(24)
    _check(returned, [x, w, b], 0)
    _check(matmul_after, [x, w, b, torch.randn(24, 8)], 0)
    _check(both, [x, w, b], 0)


def test_scaled_addmm_stays():
    def fn(x, w, b):
        return torch.addmm(b, x, w, beta=0.5).relu()

    _check(fn, [torch.randn(16, 32), torch.randn(32, 24), torch.randn(24)], 0)
