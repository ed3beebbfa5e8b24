"""Library code that speaks the `__torch_function__` protocol over Python values.

While kiln traces, its recording mode makes `has_torch_function(...)` true for any argument,
so a library function written the way `torch._assert` is (check, then `handle_torch_function`)
reaches the mode with plain Python values. Such calls must not break the graph, and a call
that does break must still run correctly outside the trace (timm's ViT failed with
"no implementation found for 'torch._assert'")."""

from __future__ import annotations

import pytest
import torch
from harness import check
from torch.overrides import handle_torch_function, has_torch_function

import kiln


def clamp_at_least(v, lo):
    """A library helper in torch's own style (as `torch._assert` is written)."""
    if has_torch_function((v,)):
        return handle_torch_function(clamp_at_least, (v,), v, lo)
    return max(v, lo)


def count_above(v, t):
    """The protocol over a Python value, with a tensor among the other arguments."""
    if has_torch_function((v,)):
        return handle_torch_function(count_above, (v,), v, t)
    return int((t > v).sum())


def test_torch_assert_on_a_shape_check_stays_in_one_graph():
    def fn(x):
        torch._assert(x.shape[-1] == 6, "last dim must be 6")
        return (x * 2).relu()

    check(fn, lambda: (torch.randn(3, 6),), graphs=1)


def test_failing_torch_assert_raises_like_eager():
    def fn(x):
        torch._assert(x.shape[0] == 5, "first dim must be 5")
        return x + 1

    with pytest.raises(AssertionError, match="first dim must be 5"):
        fn(torch.randn(4, 2))
    with pytest.raises(AssertionError, match="first dim must be 5"):
        kiln.compile(fn, backend="eager")(torch.randn(4, 2))


def test_torch_assert_on_a_tensor_breaks_and_matches_eager():
    def fn(x):
        torch._assert(x.abs().sum() >= 0, "never fails")
        return x * 3

    check(fn, lambda: (torch.randn(4, 3),), graphs=2)


def test_protocol_over_python_values_does_not_break():
    def fn(x, n):
        return x * clamp_at_least(n, 2)

    check(fn, lambda: (torch.randn(5), 1), graphs=1)


def test_protocol_call_that_breaks_runs_correctly_after_the_break():
    def fn(x):
        k = count_above(0.5, x)
        return x + k

    # The call reads tensor data, so it runs eagerly (nothing was recorded before it); the
    # graph after it adds the count. Later calls replay the call from the compiled code.
    check(fn, lambda: (torch.rand(7),), graphs=1)
