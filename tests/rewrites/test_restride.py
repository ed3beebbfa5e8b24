"""`as_strided_` of an intermediate (what decompositions emit for memory formats) compiles as a
view; of an input it is refused with the reason, never run wrong."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen import compile_graph_strict
from kiln.lower import GraphUnsupported
from kiln.rewrites.restride import functionalize_restrides


def _restrided(x):
    y = x * 2 + 1
    y.as_strided_((4, 6), (1, 4))  # y now reads its storage column-major
    return (y.exp() + y.sum(0), y)


def test_restride_of_an_intermediate_becomes_a_view_and_matches_eager():
    x = torch.randn(6, 4)
    gm = make_fx(_restrided)(x)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.as_strided_.default in targets
    compiled = compile_graph_strict(gm, [x])
    for inp in (x, torch.randn(6, 4)):
        got, want = compiled(inp), _restrided(inp)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        assert got[1].stride() == want[1].stride() == (1, 4)  # the restrided tensor itself


def test_restride_of_an_input_is_refused():
    def fn(x):
        x.as_strided_((4, 6), (1, 4))
        return (x + 1,)

    gm = make_fx(fn)(torch.randn(6, 4))
    assert functionalize_restrides(gm) == 0
    with pytest.raises(GraphUnsupported, match="mutates a tensor in place"):
        compile_graph_strict(gm, [torch.randn(6, 4)])
