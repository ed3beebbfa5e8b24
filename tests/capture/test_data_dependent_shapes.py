"""Ops whose output size depends on data (nonzero, boolean masks, unique, masked_select) stay in
the graph; reading such a size as a Python number is a graph break that resumes (an error under
fullgraph=True naming the op), never a size baked in from the traced call (capture/data_sizes.py).
Every check runs on fresh random data whose masks select different counts each call."""

import warnings

import pytest
import torch

import kiln
from kiln.capture.errors import Unsupported


def _inputs(n=5):
    return [torch.randn(4, 6) + 0.3 * k for k in range(n)]


def _check(f, fullgraph=False, requires_grad=False):
    cf = kiln.compile(f, fullgraph=fullgraph)
    counts = set()
    for x in _inputs():
        x.requires_grad_(requires_grad)
        got, expected = cf(x), f(x)
        torch.testing.assert_close(got, expected)
        counts.add(int((x > 0).sum()))
        if requires_grad:
            (g,) = torch.autograd.grad(got.sum(), x)
            (e,) = torch.autograd.grad(expected.sum(), x)
            torch.testing.assert_close(g, e)
    assert len(counts) > 1, "the masks must select different counts"


@pytest.mark.parametrize(
    "f",
    [
        lambda x: torch.nonzero(x > 0).float() * 2,
        lambda x: x[x > 0] * 2 + 1,
        lambda x: torch.masked_select(x, x > 0.5).exp(),
        lambda x: torch.unique((x * 2).round()) * 3,
        lambda x: x[torch.nonzero(x > 0)[:, 0], torch.nonzero(x > 0)[:, 1]].sin(),
    ],
    ids=["nonzero", "mask_index", "masked_select", "unique", "index_by_nonzero"],
)
def test_data_dependent_ops_compile_whole(f):
    _check(f, fullgraph=True)


def test_mask_assignment_compiles_with_gradients():
    def f(x):
        y = x * 1.5
        m = y > 0
        y[m] = y[m] * 3
        y[y < -1] = 0.25
        return y

    _check(f, fullgraph=True, requires_grad=True)


def size_read(x):
    y = x[x > 0]
    n = y.shape[0]
    return y.view(n, 1) * n


def size_call_and_len(x):
    idx = torch.nonzero(x > 0)
    k = idx.size(0) + len(idx)
    return torch.ones(k) * idx.sum()


def iterate_rows(x):
    total = x.new_zeros(2)
    for row in torch.nonzero(x > 0.5):
        total = total + row.float()
    return total


@pytest.mark.parametrize("f", [size_read, size_call_and_len, iterate_rows])
def test_sizes_read_into_python_break_and_stay_right(f):
    _check(f)
    out = kiln.explain(f)(torch.randn(4, 6))
    # a break (or, inside torch's own Tensor.__iter__, no resumable point: the call runs eagerly)
    assert "depends on the data" in str(out)
    with pytest.raises(Unsupported, match="depends on the data"):
        kiln.compile(f, fullgraph=True)(torch.randn(4, 6))


def test_size_read_resumes_compiled():
    """The break at `y.shape` resumes: the code after it runs in a compiled continuation, not
    eagerly for the rest of the call."""
    cf = kiln.compile(size_read)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kiln.KilnEagerWarning)
        for x in _inputs(3):
            torch.testing.assert_close(cf(x), size_read(x))


def test_item_used_as_a_size():
    def f(x):
        n = int((x > 0).sum().item())
        return torch.zeros(n) + x.sum()

    _check(f)
    with pytest.raises(Unsupported, match="item"):
        kiln.compile(f, fullgraph=True)(torch.randn(4, 6))


def test_data_dependent_branch_with_warning():
    """`if t.any():` breaks and resumes; a warnings.warn in the taken branch is said as eager
    says it."""

    def f(x):
        y = x * 2
        if (y > 3).any():
            warnings.warn("large values", stacklevel=2)
            return y - 3
        return y + 1

    cf = kiln.compile(f)
    for k in range(4):
        x = torch.randn(8) + (2.0 if k % 2 else -2.0)
        with warnings.catch_warnings(record=True) as got_w:
            warnings.simplefilter("always")
            got = cf(x)
        with warnings.catch_warnings(record=True) as exp_w:
            warnings.simplefilter("always")
            expected = f(x)
        torch.testing.assert_close(got, expected)
        said = [str(w.message) for w in got_w if not issubclass(w.category, kiln.KilnEagerWarning)]
        assert said == [str(w.message) for w in exp_w]
