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


def _conv1d(x, w, b):
    """HF GPT-2's `Conv1D`: the rows' width read off the input (`size(-1)`), which a graph
    traced with a symbolic length reads with `sym_size` nodes beside the views."""
    size_out = x.size()[:-1] + (w.size(-1),)
    return torch.addmm(b, x.view(-1, x.size(-1)), w).view(size_out)


def test_symbolic_length_size_reads_do_not_keep_the_addmm():
    """Traced with a symbolic length, a product's view is read by `sym_size` as well as by the
    pointwise op (here the second projection reads the length off the first one's output); a
    size read is not a reader of the values (the sum has the same sizes), so the rewrite happens
    as it does for a static length. A product the graph returns still keeps its `addmm`."""
    from cg_helpers import trace_dynamic

    def mlp(x, w, b, w2, b2):
        h = F.gelu(_conv1d(x, w, b), approximate="tanh")
        return x + _conv1d(h, w2, b2)

    def returned(x, w, b, w2, b2):
        h = _conv1d(x, w, b)
        return h, x + _conv1d(h.relu(), w2, b2)

    inputs = [torch.randn(2, 9, 32), torch.randn(32, 24), torch.randn(24)]
    inputs += [torch.randn(24, 32), torch.randn(32)]
    for fn, expect in ((mlp, 2), (returned, 1)):
        gm = trace_dynamic(fn, inputs, {0: (1,)})
        sizes = [n for n in gm.graph.nodes if n.target is aten.sym_size.int]
        assert any(n.args[0].target is aten.view.default for n in sizes), "a product's size read"
        assert unfuse_bias_adds(gm) == expect
        assert _targets(gm).count(aten.addmm.default) == 2 - expect
        for n in (1, 5, 9, 30):  # lengths other than the traced one, fresh random data
            fresh = [torch.randn(2, n, 32)] + [torch.randn_like(t) for t in inputs[1:]]
            torch.testing.assert_close(gm(*fresh), fn(*fresh), rtol=1e-5, atol=1e-5)
