"""Indirect loads in C++ kernels: embedding, gather, index_select and advanced indexing against
eager — fused with their consumers, on fresh random indices (negative ones, duplicates), with
eager's errors for out-of-range indices, and through autograd.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from cg_helpers import check, trace

import kiln
from kiln.codegen import compile_graph_strict
from kiln.lower.graph import is_check, is_fallback


def _randint(lo, hi, shape, dtype=torch.int64):
    return torch.randint(lo, hi, shape, dtype=dtype)


def _fallbacks(compiled):
    return [str(n.target) for n in compiled.schedule.graph.nodes if is_fallback(n)]


def _kernels_reading(compiled, buf):
    """Names of the kernels whose C++ source reads memory at an index loaded from `buf`."""
    out = []
    for k in re.split(r'(?=extern "C")', compiled.cpp_source):
        m = re.match(r'extern "C" void (\w+)', k)
        if m and re.search(
            rf"kiln::indirect(_wrap)?\(static_cast<int64_t>\(kiln::load\({buf}\[", k
        ):
            out.append(m.group(1))
    return out


def test_embedding_add_layer_norm_is_one_kernel_without_extern_calls():
    def fn(w, idx, b, lw, lb):
        e = F.embedding(idx, w) + b
        return F.layer_norm(e, (w.shape[1],), lw, lb)

    n, d = 50, 48
    args = (
        torch.randn(n, d),
        _randint(0, n, (4, 9)),
        torch.randn(d),
        torch.randn(d),
        torch.randn(d),
    )

    def fresh():
        idx = _randint(0, 5, (4, 9))  # few distinct rows: many duplicates
        idx[0, :3] = torch.tensor([0, n - 1, n - 1])
        return (torch.randn(n, d), idx, torch.randn(d), torch.randn(d), torch.randn(d))

    compiled = check(fn, *args, inputs_fn=fresh)
    assert _fallbacks(compiled) == []
    # the gather feeds the two reductions and the normalized row inside one kernel
    kernels = _kernels_reading(compiled, "arg1")
    assert len(kernels) == 1, kernels
    members = next(k for k in compiled.schedule.kernels if k.name == kernels[0]).members
    assert len(members) == 3
    assert "indirect(arg1[i0, i1], 50)" in str(compiled.schedule.graph)


def test_gather_and_index_select_on_views_and_computed_tensors():
    def fn(x, i0, i1, i2, sel):
        return (
            torch.gather(x, 0, i0),
            torch.gather(x.t(), 1, i1),  # a transposed source
            torch.gather(x.exp(), 1, i2) * 2,  # a computed source, inlined into the gather
            torch.index_select(x, 1, sel),
            torch.index_select(x.t(), 0, sel.to(torch.int32)),  # int32 indices
        )

    def inputs():
        return (
            torch.randn(7, 11),
            _randint(0, 7, (3, 11)),
            _randint(0, 7, (11, 5)),
            _randint(0, 11, (7, 4)),
            _randint(0, 11, (6,)),
        )

    compiled = check(fn, *inputs(), inputs_fn=inputs)
    assert _fallbacks(compiled) == []
    stored = [n.name for n in compiled.schedule.graph.nodes if "exp" in str(n)]
    assert stored and all(
        tuple(n.size) == (7, 4) for n in compiled.schedule.graph.nodes if n.name in stored
    ), "exp(x) was stored whole instead of computed at the gathered elements"


def test_take_and_zero_dim_gathers():
    def fn(x, s, i, j, k):
        return (
            torch.take(x, i),  # flat positions, negative ones from the end
            torch.gather(s, 0, j),  # 0-d source and index
            torch.index_select(s, 0, j),
            torch.gather(x[0], 0, k),  # 1-d source, 0-d index
        )

    def inputs():
        return (
            torch.randn(3, 5),
            torch.randn(()),
            _randint(-15, 15, (2, 4)),
            torch.tensor(0),
            _randint(0, 5, ()),
        )

    compiled = check(fn, *inputs(), inputs_fn=inputs)
    assert _fallbacks(compiled) == []


def test_advanced_indexing_with_negative_indices_none_and_broadcasting():
    def fn(x, a, b, c):
        return (
            x[a],  # first dim
            x[:, b],  # after a slice
            x[a.unsqueeze(1), :, c],  # separated tensor indices: their dims come first
            x[:, b.unsqueeze(1), c],  # adjacent, broadcast [4,1] with [5]
            torch.ops.aten.index.Tensor(x, [None, None, c]),
        )

    def inputs():
        return (
            torch.randn(6, 8, 10),
            _randint(-6, 6, (4,)),  # negative indices count from the end, as in eager
            _randint(-8, 8, (4,)),
            _randint(-10, 10, (5,)),
        )

    compiled = check(fn, *inputs(), inputs_fn=inputs)
    assert _fallbacks(compiled) == []
    assert "kiln::indirect_wrap(" in compiled.cpp_source


def test_indices_computed_in_the_graph_and_cross_entropys_gather():
    def fn(x, t):
        best = torch.gather(x, 1, x.argmax(1, keepdim=True))  # positions: in range, no check
        worst = x[torch.arange(x.shape[0]), x.argmin(1)]
        nll = -torch.gather(x.log_softmax(-1), 1, t.unsqueeze(1)).mean()
        shuffled = x[:, (torch.arange(x.shape[1]) * 3) % x.shape[1]]
        return best, worst, nll, shuffled

    def inputs():
        return torch.randn(16, 40), _randint(0, 40, (16,))

    compiled = check(fn, *inputs(), inputs_fn=inputs)
    graph = compiled.schedule.graph
    assert _fallbacks(compiled) == []
    checked = [n.args[2] for n in graph.nodes if is_check(n)]
    assert checked == ["aten.gather.default", "aten.index.Tensor"]  # the targets, the shuffle
    # the log-softmax is never stored: the loss reads the gathered logits and the row stats
    stored = [n.name for n in graph.nodes if getattr(n, "size", None) == (16, 40)]
    assert stored == [graph.outputs[-1]]


def test_boolean_mask_index_stays_an_extern_call_and_matches_eager():
    def fn(x, m):
        return (x[m] * 2,)

    compiled = check(fn, torch.randn(5, 3), torch.rand(5) > 0.5, fresh=False)
    assert any("index" in t for t in _fallbacks(compiled))


def test_positional_indices_need_no_memory_read_or_check():
    def fn(wpe, x):
        pos = torch.arange(0, x.shape[1])
        return (x + F.embedding(pos, wpe),)

    compiled = check(fn, torch.randn(16, 8), torch.randn(2, 12, 8))
    graph = compiled.schedule.graph
    assert not any(is_check(n) for n in graph.nodes)
    assert "indirect" not in str(graph)


@pytest.mark.parametrize(
    "fn, args, error, message",
    [
        (lambda w, i: F.embedding(i, w), (torch.randn(5, 3), torch.tensor([[1, 5]])),
         IndexError, "index 5 is out of bounds for dimension 0 with size 5"),
        (lambda w, i: F.embedding(i, w), (torch.randn(5, 3), torch.tensor([0, -1])),
         IndexError, "index -1 is out of bounds"),  # embedding takes no negative indices
        (lambda x, i: torch.gather(x, 1, i), (torch.randn(4, 3), torch.tensor([[0], [3]])),
         RuntimeError, "index 3 is out of bounds for dimension 1 with size 3"),
        (lambda x, i: torch.index_select(x, 0, i), (torch.randn(4, 3), torch.tensor([9, 0])),
         IndexError, "index 9 is out of bounds"),
        (lambda x, i: x[:, i], (torch.randn(4, 3), torch.tensor([2, -4])),
         IndexError, "index -4 is out of bounds for dimension 1 with size 3"),
    ],
)  # fmt: skip
def test_out_of_range_indices_raise_eagers_error(fn, args, error, message):
    with pytest.raises(error):
        fn(*args)  # eager raises the same kind of error
    good = (args[0], torch.zeros_like(args[1]))
    compiled = compile_graph_strict(trace(lambda *a: (fn(*a) * 1,), *good), good)
    compiled(*good)  # in range: runs
    with pytest.raises(error, match=re.escape(message)):
        compiled(*args)


def test_embedding_and_gather_training_step_matches_eager():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(40, 16)
            self.ln = torch.nn.LayerNorm(16)
            self.head = torch.nn.Linear(16, 40)

        def forward(self, idx, pick):
            h = self.head(self.ln(self.emb(idx)))
            return torch.gather(h.log_softmax(-1), 2, pick).mean() + h[:, -1].pow(2).mean()

    torch.manual_seed(0)
    model = Model()
    ref = Model()
    ref.load_state_dict(model.state_dict())
    compiled = kiln.compile(model)
    for _ in range(2):  # fresh indices each step; the second step reuses the compiled graphs
        idx = _randint(0, 40, (3, 7))
        pick = _randint(0, 40, (3, 7, 2))
        loss = compiled(idx, pick)
        expected = ref(idx, pick)
        torch.testing.assert_close(loss, expected)
        loss.backward()
        expected.backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
            p.grad = q.grad = None


def test_the_wrapper_calls_the_bounds_check_as_a_plain_function():
    # Through the op, each check cost a dispatch into Python and back (several times the check
    # itself, once per embedding or gather a call); the wrapper calls the function directly.
    from kiln.devices.runtime_ops import check_index

    def fn(w, i):
        return (F.embedding(i, w) * 2,)

    w, i = torch.randn(50, 8), torch.randint(0, 50, (3, 7))
    compiled = check(fn, w, i, inputs_fn=lambda: (torch.randn(50, 8), torch.randint(0, 50, (3, 7))))
    namespace = compiled._fn.__globals__
    checks = [v for k, v in namespace.items() if "check_index" in k]
    assert checks and all(v is check_index for v in checks)
    with pytest.raises(IndexError, match="index 50 is out of bounds for dimension 0 with size 50"):
        compiled(w, torch.full((3, 7), 50))
