"""codegen/embedding_grad.py: a tied embedding's gradient, `mm + embedding_dense_backward`, becomes
one `index_put(mm, [indices], grad, accumulate=True)`; every other use of the embedding gradient
stays. The rewritten graph computes what the original does, on fresh random data (indices with
repeats, so rows are summed), and so does the Triton path that applies it (interpreter)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from tr_helpers import assert_matches_eager, compile_fn, require_interpreter

from kiln.codegen.embedding_grad import scatter_embedding_grads

aten = torch.ops.aten
V, D, B, T = 50, 16, 3, 20  # 60 indices into 50 rows: repeats are certain


def _targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _tied(x, g, idx):
    """The shared weight's gradient in a tied language model: the output projection's (an mm)
    plus the token embedding's."""
    out_proj = g.reshape(-1, V).t() @ x.reshape(-1, D)  # [V, D]
    emb = aten.embedding_dense_backward(x, idx, V, -1, False)
    return (out_proj + emb,)


def _inputs():
    return [torch.randn(B, T, D), torch.randn(B, T, V), torch.randint(0, V, (B, T))]


def _layouts(gm) -> dict:
    return {
        n.name: (tuple(v.shape), tuple(v.stride()), v.dtype)
        for n in gm.graph.nodes
        if isinstance(v := n.meta.get("val"), torch.Tensor)
    }


def _rewritten(fn, inputs, expect: int):
    gm = make_fx(fn, tracing_mode="fake")(*inputs)
    assert scatter_embedding_grads(gm) == expect
    kept = _layouts(gm)
    FakeTensorProp(gm, FakeTensorMode()).propagate(*inputs)  # the rewrite's `val`s hold
    assert _layouts(gm) == kept
    return gm


def test_tied_embedding_gradient_is_scattered_into_the_matmul_gradient():
    gm = _rewritten(_tied, _inputs(), 1)
    assert aten.embedding_dense_backward.default not in _targets(gm)
    assert aten.index_put.default in _targets(gm) and aten.add.Tensor not in _targets(gm)
    for _ in range(2):
        fresh = _inputs()
        torch.testing.assert_close(gm(*fresh)[0], _tied(*fresh)[0], rtol=1e-5, atol=1e-5)


def test_embedding_gradients_read_otherwise_stay():
    def padded(x, g, idx):
        out_proj = g.reshape(-1, V).t() @ x.reshape(-1, D)
        return (out_proj + aten.embedding_dense_backward(x, idx, V, 0, False),)

    def scaled(x, g, idx):
        out_proj = g.reshape(-1, V).t() @ x.reshape(-1, D)
        return (out_proj + aten.embedding_dense_backward(x, idx, V, -1, True),)

    def broadcast(x, g, idx):
        return (aten.embedding_dense_backward(x, idx, V, -1, False) + g[0, 0, :D],)

    def returned_too(x, g, idx):
        emb = aten.embedding_dense_backward(x, idx, V, -1, False)
        return g.reshape(-1, V).t() @ x.reshape(-1, D) + emb, emb

    def alone(x, g, idx):
        return (aten.embedding_dense_backward(x, idx, V, -1, False),)

    for fn in (padded, scaled, broadcast, returned_too, alone):
        gm = _rewritten(fn, _inputs(), 0)
        assert aten.embedding_dense_backward.default in _targets(gm), fn.__name__


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_path_scatters_and_matches_eager(dtype):
    require_interpreter()
    inputs = [t.to(dtype) if t.is_floating_point() else t for t in _inputs()]
    compiled = compile_fn(_tied, *inputs)
    assert "aten_index_put" in compiled.wrapper_source
    assert "embedding_dense_backward" not in compiled.wrapper_source
    for args in (inputs, [t.to(dtype) if t.is_floating_point() else t for t in _inputs()]):
        # bfloat16: eager rounds the embedding gradient, then the sum; the scatter rounds once,
        # so both are judged against float64 (tr_helpers, step 2)
        wide = [t.double() if t.is_floating_point() else t for t in args]
        reference = (lambda w=wide: _tied(*w)[0]) if dtype != torch.float32 else None
        assert_matches_eager(compiled(*args)[0], _tied(*args)[0], reference)
