"""Lowering: the registry checks itself, the IR prints as code, views are index arithmetic,
unlowered ops become counted extern calls, and the verifier rejects malformed graphs.
"""

from __future__ import annotations

import logging

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.lower import IRError, lower_graph, register_lowering, verify
from kiln.lower.indexing import index_vars, reshape_indexer
from kiln.lower.ir import Extern, Layout, Load, LoopGraph, Pointwise, Reduction, View


def _lower(fn, *inputs):
    return lower_graph(make_fx(fn)(*inputs), inputs)


def test_registry_rejects_unknown_ops_and_duplicates():
    with pytest.raises(AssertionError, match="no op"):
        register_lowering("definitely_not_an_op.default")
    with pytest.raises(AssertionError, match="no overload"):
        register_lowering("add.NoSuchOverload")
    with pytest.raises(AssertionError, match="twice"):
        register_lowering("add.Tensor")(lambda ctx, a, b: None)


def test_softmax_lowers_to_two_reductions_and_one_pointwise_that_print_as_code():
    g = verify(_lower(lambda x: torch.softmax(x, -1), torch.randn(4, 6)))
    kinds = [type(n).__name__ for n in g.nodes]
    assert kinds == ["Input", "Reduction", "Reduction", "Pointwise"]
    text = str(g)
    assert "max[i0] over [r0] in [6] arg0[i0, r0]" in text
    assert "exp(sub(arg0[i0, r0], buf0[i0]))" in text
    assert text.splitlines()[-1] == "return (buf2)"


def test_views_compose_into_loads_of_the_base():
    g = verify(_lower(lambda x: x.t().unsqueeze(0)[:, 1:] * 2, torch.randn(5, 4)))
    (pw,) = [n for n in g.nodes if isinstance(n, Pointwise)]
    (ld,) = [e for e in [pw.body.args[0]] if isinstance(e, Load)]
    assert ld.buf == "arg0"  # read straight from the input, no copy
    i0, i1, i2 = index_vars(3)
    # Eager keeps the transposed input's memory order for the product, so the kernel walks
    # [1, 5, 3] (the view's dims 0, 2, 1) and reads the input in its own row-major order.
    assert pw.size == (1, 5, 3)
    assert ld.index == (i1, i2 + 1)


@pytest.mark.parametrize(
    "old,new",
    [((6, 4), (24,)), ((24,), (2, 3, 4)), ((2, 3, 4), (6, 4)), ((4, 6), (2, 12)),
     ((1, 5, 1), (5,)), ((3, 1, 4), (12, 1)), ((2, 6), (4, 3))],
)  # fmt: skip
def test_reshape_indexer_matches_torch_reshape(old, new):
    base = torch.randn(old)
    view = base.reshape(new)
    index = reshape_indexer(old, new, index_vars(len(new)))
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        pos = [int(torch.randint(0, s, (1,), generator=gen)) for s in new]
        sub = dict(zip(index_vars(len(new)), pos))
        src = [int(sympy.sympify(e).xreplace(sub)) for e in index]
        assert view[tuple(pos)] == base[tuple(src)]


def test_unlowered_op_becomes_counted_extern_with_perf_hint():
    records = []

    class H(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    h = H()
    logging.getLogger("kiln.perf_hints").addHandler(h)
    kiln.set_logs("perf_hints")
    try:
        g = _lower(lambda x: torch.mm(x, x).cumsum(0), torch.randn(3, 3))
    finally:
        kiln.set_logs()
        logging.getLogger("kiln.perf_hints").removeHandler(h)
    externs = [n for n in g.nodes if isinstance(n, Extern)]
    assert [str(n.target) for n in externs] == ["aten.mm.default", "aten.cumsum.default"]
    assert all(n.reason == "no lowering" for n in externs)
    assert any("aten.cumsum.default" in m for m in records)


def test_unsupported_dtype_and_declined_lowering_become_externs():
    g = _lower(lambda x: (x * 2, x.to(torch.complex64)), torch.randn(3))
    reasons = {str(n.target): n.reason for n in g.nodes if isinstance(n, Extern)}
    assert "complex64" in reasons["aten._to_copy.default"]


def test_keepdim_and_multi_output_reductions():
    g = verify(_lower(lambda x: x.max(1, keepdim=True), torch.randn(3, 5)))
    reds = [n for n in g.nodes if isinstance(n, Reduction)]
    assert sorted(r.reduce_type for r in reds) == ["argmax", "max"]
    assert all(isinstance(g.node_map()[o], View) for o in g.outputs)


def test_verifier_rejects_bad_graphs():
    lay = Layout((4,), (1,), torch.float32)
    from kiln.lower.ir import Input

    i0 = index_vars(1)[0]
    bad_buf = Pointwise("buf1", (4,), torch.float32, Load("nope", (i0,), torch.float32))
    with pytest.raises(IRError, match="not defined"):
        verify(LoopGraph((Input("arg0", lay), bad_buf), ("arg0",), ("buf1",)))
    bad_rank = Pointwise("buf1", (4,), torch.float32, Load("arg0", (i0, i0), torch.float32))
    with pytest.raises(IRError, match="rank"):
        verify(LoopGraph((Input("arg0", lay), bad_rank), ("arg0",), ("buf1",)))
    r0 = sympy.Symbol("r0", integer=True, nonnegative=True)
    bad_var = Pointwise("buf1", (4,), torch.float32, Load("arg0", (r0,), torch.float32))
    with pytest.raises(IRError, match="loop variables"):
        verify(LoopGraph((Input("arg0", lay), bad_var), ("arg0",), ("buf1",)))
