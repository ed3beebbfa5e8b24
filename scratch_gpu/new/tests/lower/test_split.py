"""`split`, `split_with_sizes`, `chunk` and `unbind` are pure aliasing: each lowers to one `View`
per piece (an offset along the dimension), so the wrapper calls no ATen op for them. Compiled
graphs (the C++ path) are compared with eager on fresh random inputs.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen import compile_graph_strict
from kiln.lower import lower_graph
from kiln.lower.indexing import index_vars
from kiln.lower.ir import Extern, View


def _check(fn, *inputs):
    gm = make_fx(fn)(*inputs)
    compiled = compile_graph_strict(gm, list(inputs))
    for args in (inputs, [torch.randn_like(x) for x in inputs]):
        got, want = compiled(*args), fn(*args)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w)
    return compiled


@pytest.mark.parametrize(
    "split",
    [
        lambda x: x.split(3, dim=1),  # 3 + 3 + 1
        lambda x: x.split([2, 5], dim=-2),
        lambda x: x.chunk(3, dim=1),
        lambda x: x.unbind(0),
        lambda x: x.unbind(-1),
        lambda x: x.split(8, dim=1),  # one piece: x itself
    ],
    ids=["split", "split_with_sizes", "chunk", "unbind", "unbind_last", "one_piece"],
)
def test_pieces_are_views_of_the_input_and_match_eager(split):
    def fn(x):
        return tuple(p * (k + 1) for k, p in enumerate(split(x)))

    x = torch.randn(4, 7, 5)
    graph = lower_graph(make_fx(fn)(x), [x])
    assert not any(isinstance(n, Extern) for n in graph.nodes), str(graph)
    _check(fn, x)


def test_piece_offsets_along_the_dimension():
    x = torch.randn(2, 9)
    graph = lower_graph(make_fx(lambda x: x.split([2, 3, 4], dim=1))(x), [x])
    i0, i1 = index_vars(2)
    views = [n for n in graph.nodes if isinstance(n, View)]
    assert [(v.base, v.size, v.index) for v in views] == [
        ("arg0", (2, 2), (i0, i1)),
        ("arg0", (2, 3), (i0, i1 + 2)),
        ("arg0", (2, 4), (i0, i1 + 5)),
    ]


def test_attention_qkv_split_is_no_call_and_its_pieces_are_returned_as_views():
    # GPT-2: one linear makes q, k and v side by side; each head view reads it in place
    def fn(h, w):
        qkv = (h @ w).view(2, 8, 3 * 16)
        q, k, v = qkv.split(16, dim=2)
        heads = [t.view(2, 8, 2, 8).transpose(1, 2) for t in (q, k, v)]
        return (heads[0] @ heads[1].transpose(-1, -2), heads[2], v)

    compiled = _check(fn, torch.randn(16, 32), torch.randn(32, 48))
    assert "split" not in compiled.wrapper_source
    assert compiled.wrapper_source.count("_as_strided(") >= 2  # v and its head view


def test_a_split_of_a_computed_tensor_reads_it_at_each_offset():
    def fn(x):
        a, b = (x.exp() * 2).split(3, dim=0)
        return (a - b, b.sum(0))

    _check(fn, torch.randn(6, 5))
