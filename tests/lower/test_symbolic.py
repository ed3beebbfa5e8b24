"""Lowering and scheduling graphs traced with symbolic sizes (`make_fx(tracing_mode="symbolic")`):
sizes are expressions over the shape symbols, reshapes group dimensions only where the groups
are equal for every size, what cannot be expressed becomes an ATen call, static graphs lower as
before, and a device without symbolic kernels declines such a graph with the reason.
"""

from __future__ import annotations

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.lower import lower_graph
from kiln.lower.indexing import (
    FloorDiv,
    ModularIndexing,
    ReshapeUnsupported,
    index_vars,
    reshape_indexer,
)
from kiln.lower.ir import Extern, Input, Reduction
from kiln.lower.symbolic import hint, using_hints
from kiln.schedule import Kernel, schedule


def _sym(fn, *inputs):
    gm = make_fx(fn, tracing_mode="symbolic")(*inputs)
    return lower_graph(gm, inputs)


def _symbols(graph):
    return {str(s): s for s in graph.hints}


def test_input_sizes_are_expressions_and_hints_are_the_sizes_seen():
    g = _sym(lambda x: torch.softmax(x, -1) * 2, torch.randn(5, 7))
    (inp,) = [n for n in g.nodes if isinstance(n, Input)]
    s0, s1 = inp.layout.size
    assert isinstance(s0, sympy.Symbol) and isinstance(s1, sympy.Symbol)
    assert inp.layout.stride == (s1, 1)
    with using_hints(g.hints):
        assert (hint(s0), hint(s1), hint(s0 * s1 + 1)) == (5, 7, 36)
    red = [n for n in g.nodes if isinstance(n, Reduction)]
    assert red and all(r.reduce_size == (s1,) for r in red)
    assert g.symbolic


def test_reduction_over_a_symbolic_dim_divides_by_its_value():
    g = _sym(lambda x: x.mean(0), torch.randn(6, 4))
    text = str(g)
    assert "truediv" in text and "index(s" in text  # mean = sum / s0, s0 read per call


def test_reshape_groups_symbolic_dims_only_when_equal_for_every_size():
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    with using_hints({s0: 3, s1: 5}):
        ix = reshape_indexer((s0, s1, 4), (s0 * s1, 4), index_vars(2))
    i0, i1 = index_vars(2)
    assert ix == (FloorDiv(i0, s1), ModularIndexing(i0, s1), i1)
    with using_hints({s0: 3, s1: 5}), pytest.raises(ReshapeUnsupported):
        reshape_indexer((s0, s1), (s1, s1), index_vars(2))  # equal only when s0 == s1


def test_views_of_symbolic_inputs_stay_aliases_and_matmul_is_an_extern_call():
    def f(x, w):
        return (x.reshape(-1, x.shape[-1]) @ w).view(x.shape[0], x.shape[1], -1)

    g = _sym(f, torch.randn(3, 5, 8), torch.randn(8, 6))
    (mm,) = [n for n in g.nodes if isinstance(n, Extern)]
    assert "mm" in str(mm.target)
    sched = schedule(g)
    # the reshape of the contiguous input is read in place: no copy kernel before the matmul
    assert not sched.kernels, str(sched)


def test_symbolic_fusion_puts_softmax_in_one_kernel_of_symbolic_rows():
    g = _sym(lambda x: torch.softmax(x, -1), torch.randn(6, 10))
    sched = schedule(g)
    (k,) = sched.kernels
    assert isinstance(k, Kernel) and len(k.members) == 3
    assert not isinstance(k.outer, int) and not isinstance(k.inner, int)


def test_static_graphs_lower_exactly_as_before():
    def f(x):
        return torch.softmax(x.view(4, -1), -1).sum(0)

    x = torch.randn(4, 3, 5)
    g = lower_graph(make_fx(f)(x), [x])
    assert not g.symbolic and g.hints == {}
    assert "[4, 15]" in str(g)
