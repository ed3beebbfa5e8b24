"""Indirect loads in the loop IR: gather-like ops lower to loads at an index read from memory,
print as code, compose with views, come with one bounds check per index tensor, and stay
extern calls where the target renderer has no indirect loads.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.devices import Capabilities
from kiln.lower import IRError, lower_graph, verify
from kiln.lower.graph import graph_device, is_check, is_fallback
from kiln.lower.indexing import Indirect, index_vars
from kiln.lower.ir import Input, Layout, Load, LoopGraph, Pointwise, loads


def _lower(fn, *inputs, **kw):
    return lower_graph(make_fx(fn)(*inputs), inputs, **kw)


def test_embedding_prints_as_a_load_at_an_indirect_index_with_one_check():
    w, idx = torch.randn(10, 4), torch.randint(0, 10, (2, 3))
    g = verify(_lower(lambda w, i: F.embedding(i, w) * 2 + F.embedding(i, w), w, idx))
    text = str(g)
    assert "f32[2, 3, 4] = pointwise[i0, i1, i2] arg0[indirect(arg1[i0, i1], 10), i2]" in text
    checks = [n for n in g.nodes if is_check(n)]
    assert len(checks) == 1, text  # one check per index tensor and size, however often used
    assert "kiln.check_index.default(buf0, buf1, aten.embedding.default, 0, 10, True)" in text
    assert not any(is_fallback(n) for n in g.nodes)


def test_indirect_reads_count_as_loads_of_the_index_buffer():
    x, idx = torch.randn(6, 5), torch.randint(0, 5, (6, 2))
    g = _lower(lambda x, i: torch.gather(x.t().contiguous().t(), 1, i), x, idx)
    (pw,) = [n for n in g.nodes if isinstance(n, Pointwise) and n.size == (6, 2)]
    i0, i1 = index_vars(2)
    assert [(ld.buf, ld.index) for ld in loads(pw.body) if ld.buf == "arg1"] == [("arg1", (i0, i1))]


def test_views_compose_through_indirect_terms():
    x, idx = torch.randn(4, 6), torch.randint(-6, 6, (3,))
    g = verify(_lower(lambda x, i: x.t()[i], x, idx))
    (pw,) = [n for n in g.nodes if isinstance(n, Pointwise) and n.size == (3, 4)]
    (ld,) = [e for e in [pw.body] if isinstance(e, Load)]
    i0, i1 = index_vars(2)
    assert ld.buf == "arg0"  # the transposed view is read through, no copy
    assert ld.index == (i1, Indirect.make("arg1", (i0,), 6, True))
    assert "arg0[i1, indirect(arg1[i0], 6, wrap)]" in str(g)


def test_without_indirect_loads_the_ops_stay_extern_calls_with_the_reason():
    w, idx = torch.randn(10, 4), torch.randint(0, 10, (2, 3))
    g = _lower(lambda w, i: (F.embedding(i, w), w[i], torch.gather(w, 0, i)), w, idx,
               capabilities=Capabilities(indirect_loads=False))  # fmt: skip
    externs = {str(n.target): n.reason for n in g.nodes if is_fallback(n)}
    assert set(externs) == {"aten.embedding.default", "aten.index.Tensor", "aten.gather.default"}
    assert all("no indirect loads" in r for r in externs.values())
    assert "indirect" not in str(g)


def test_graph_device_is_read_from_placeholder_metadata_first():
    gm = make_fx(lambda x: x + 1)(torch.randn(3))
    assert graph_device(gm, [torch.randn(3)]).type == "cpu"
    (ph,) = [n for n in gm.graph.nodes if n.op == "placeholder"]

    class _OnGpu(torch.Tensor):  # stands for a CUDA fake tensor on a machine without CUDA
        @property
        def device(self):
            return torch.device("cuda", 0)

    ph.meta["val"] = torch.randn(3).as_subclass(_OnGpu)
    assert graph_device(gm, [torch.randn(3)]).type == "cuda"


def test_verifier_rejects_a_float_index_buffer():
    lay_x, lay_i = Layout((4,), (1,), torch.float32), Layout((4,), (1,), torch.float32)
    (i0,) = index_vars(1)
    body = Load("x", (Indirect.make("idx", (i0,), 4, False),), torch.float32)
    g = LoopGraph(
        (Input("x", lay_x), Input("idx", lay_i), Pointwise("buf0", (4,), torch.float32, body)),
        ("x", "idx"),
        ("buf0",),
    )
    with pytest.raises(IRError, match="indirect index reads idx of dtype torch.float32"):
        verify(g)
