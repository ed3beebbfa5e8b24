"""`kiln.mark_static`, `kiln.maybe_mark_dynamic`, `kiln.mark_dynamic` and `dynamic=True/False/
None` with torch.compile's rules, and the 0/1 policy as it behaves (docs/dynamic_shapes.md).

Each test counts the graphs handed to the backend and checks every call against eager on fresh
random data; the placeholder's example value says whether a dimension was symbolic."""

import pytest
import torch
import torch.nn as nn
from harness import CountingBackend

import kiln


def _symbolic_dims(gm) -> list[bool]:
    ph = [
        n
        for n in gm.graph.find_nodes(op="placeholder")
        if isinstance(n.meta.get("example_value"), torch.Tensor)
    ][0]
    return [isinstance(s, torch.SymInt) for s in ph.meta["example_value"].shape]


def _fn(x):
    return (x.sin() * 2).sum(0) + x.shape[1]


def _run(dynamic, shapes, mark=None):
    backend = CountingBackend()
    f = kiln.compile(_fn, backend=backend, dynamic=dynamic)
    for shape in shapes:
        x = torch.randn(*shape)
        if mark is not None:
            mark(x)
        torch.testing.assert_close(f(x), _fn(x))
    return backend.graphs


def test_mark_static_under_dynamic_true_keeps_that_dim_static():
    graphs = _run(True, [(3, 5), (4, 6), (4, 7)], mark=lambda x: kiln.mark_static(x, 0))
    assert len(graphs) == 2  # a graph per size of dim 0; dim 1 is symbolic in each
    assert all(_symbolic_dims(g) == [False, True] for g in graphs)


def test_mark_static_under_automatic_dynamic_gives_an_entry_per_size():
    graphs = _run(None, [(3, 5), (4, 5), (6, 5)], mark=lambda x: kiln.mark_static(x, 0))
    assert len(graphs) == 3 and all(_symbolic_dims(g) == [False, False] for g in graphs)


def test_mark_static_without_a_dim_marks_every_dim():
    graphs = _run(True, [(3, 5), (3, 6)], mark=lambda x: kiln.mark_static(x))
    assert len(graphs) == 2 and all(_symbolic_dims(g) == [False, False] for g in graphs)


def test_mark_dynamic_wins_over_mark_static():
    def both(x):
        kiln.mark_static(x, 0)
        kiln.mark_dynamic(x, 0)

    graphs = _run(None, [(3, 5), (4, 5), (9, 5)], mark=both)
    assert len(graphs) == 1 and _symbolic_dims(graphs[0]) == [True, False]


def test_mark_dynamic_is_honoured_under_dynamic_false():
    graphs = _run(False, [(3, 5), (4, 5), (9, 5)], mark=lambda x: kiln.mark_dynamic(x, 0))
    assert len(graphs) == 1 and _symbolic_dims(graphs[0]) == [True, False]


def test_dynamic_false_gives_an_entry_per_size():
    graphs = _run(False, [(3, 5), (4, 5), (9, 5)])
    assert len(graphs) == 3 and all(_symbolic_dims(g) == [False, False] for g in graphs)


def test_maybe_mark_dynamic_is_symbolic_from_the_first_call():
    graphs = _run(None, [(3, 5), (4, 5), (9, 5)], mark=lambda x: kiln.maybe_mark_dynamic(x, 0))
    assert len(graphs) == 1 and _symbolic_dims(graphs[0]) == [True, False]


def test_automatic_dynamic_generalizes_only_what_changed():
    graphs = _run(None, [(3, 5), (4, 5), (9, 5)])
    assert len(graphs) == 2 and _symbolic_dims(graphs[1]) == [True, False]


def test_mark_static_accepts_a_module_class_and_returns_it():
    class Block(nn.Module):
        def forward(self, x):
            return x * 2

    assert kiln.mark_static(Block) is Block


@pytest.mark.parametrize("mark", [kiln.mark_static, kiln.maybe_mark_dynamic, kiln.mark_dynamic])
def test_marks_name_a_bad_dimension(mark):
    with pytest.raises(IndexError, match=f"kiln.{mark.__name__}: dimension 2 out of range"):
        mark(torch.randn(2, 3), 2)
    with pytest.raises(TypeError, match="expected a tensor"):
        mark([1, 2], 0)


def _linear_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("model", ["linear", "pointwise"])
def test_sizes_zero_and_one_cost_at_most_one_entry_each(dynamic, model):
    """kiln specializes no size up front; sizes 0 and 1 meet kernel facts (an empty tensor, a
    size-1 dimension's ambiguous stride) that a trace at a size of 2 or more guards, so each
    costs at most one extra entry per dimension, reused by every later call of that size."""
    mod = _linear_net() if model == "linear" else (lambda x: (x.sin() * 2).sum(0))
    backend = CountingBackend()
    f = kiln.compile(mod, backend=backend, dynamic=dynamic)
    first = (4, 6, 1, 0, 7, 1, 0, 9)
    for n in first:
        x = torch.randn(n, 8)
        torch.testing.assert_close(f(x), mod(x))
    made = len(backend.graphs)
    assert made <= 4  # a size of 2 or more (twice under dynamic=None), 1, 0
    for n in (0, 1, 5, 11, 1, 0):
        x = torch.randn(n, 8)
        torch.testing.assert_close(f(x), mod(x))
    assert len(backend.graphs) == made
