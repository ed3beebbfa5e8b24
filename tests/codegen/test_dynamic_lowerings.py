"""`kiln.compile(fn, dynamic=True)` on the CPU: ops that lower to kernels at static sizes lower
to kernels at symbolic sizes too (the OpInfo sweep's `--dynamic` count,
benchmarks/opinfo_sweep.py), one build serves every later size, and results match eager on
fresh random data at each size (odd ones included).

Each test watches the code generator the way the sweep does: every graph kiln.compile hands
`kiln.codegen.compile_graph` must come back compiled (not declined, not raising) with no ATen
call left in its schedule.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.codegen as codegen
from kiln.codegen import Declined
from kiln.lower.graph import is_fallback


class Watch:
    """What kiln.compile gave the code generator: each graph's result, or the error it raised."""

    def __init__(self, monkeypatch):
        self.built: list = []
        real = codegen.compile_graph

        def watched(*a, **k):
            try:
                out = real(*a, **k)
            except Exception as e:
                self.built.append(e)
                raise
            self.built.append(out)
            return out

        monkeypatch.setattr(codegen, "compile_graph", watched)

    def assert_all_kernels(self) -> None:
        assert self.built, "no graph reached the code generator"
        for g in self.built:
            assert not isinstance(g, Exception), f"code generation raised {g!r}"
            assert not isinstance(g, Declined), f"declined: {g.reason}"
            calls = [str(n.target) for n in g.schedule.graph.nodes if is_fallback(n)]
            assert not calls, f"ATen calls left: {calls}"


def _check(fn, make, sizes, monkeypatch, **tol):
    """`fn` compiled with dynamic=True, called at every size of `sizes` (fresh random inputs
    from `make(n)`): matches eager at each, kernels only, and built once for all of them."""
    kiln.reset()
    watch = Watch(monkeypatch)
    compiled = kiln.compile(fn, dynamic=True, options={"warn_eager": False})
    for k, n in enumerate(sizes):
        args = make(n)
        mine = [a.clone() for a in args]  # a function may update its inputs (running stats)
        expected = (*_seq(fn(*args)), *args)
        got = (*_seq(compiled(*mine)), *mine)
        for g, e in zip(got, expected, strict=True):
            assert g.shape == e.shape and g.dtype == e.dtype, (n, g.shape, e.shape)
            torch.testing.assert_close(g, e, equal_nan=True, **tol)
        if k == 0:
            first = len(watch.built)
    watch.assert_all_kernels()
    assert len(watch.built) == first, f"{len(watch.built) - first} builds after the first size"


def _seq(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


SIZES = (5, 2, 7, 16, 33)


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_max_pool_at_symbolic_sizes_is_a_kernel(ceil_mode, monkeypatch):
    # pooling read its output sizes with int(): the first call's sizes baked into the kernel
    def f(x, y):
        a, i = F.max_pool1d(x, 3, 2, 0, 1, ceil_mode, True)
        b = F.max_pool2d(y, 3, 2, 1, 1, ceil_mode)
        return a, i, b

    def make(n):
        return torch.randn(2, 3, n + 4), torch.randn(2, 3, n + 4, n + 3)

    _check(f, make, SIZES, monkeypatch, rtol=0, atol=0)


def test_float_arithmetic_on_sizes_is_computed_in_the_kernel(monkeypatch):
    # batch norm's running variance scales by n / (n - 1), a SymFloat over the symbolic sizes:
    # the whole graph was declined ("size expression IntTrueDiv(...)")
    def f(x, w, b, rm, rv):
        y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3)
        return y, rm * x.shape[0] / (x.shape[2] + 1.5), rv

    def make(n):
        c = 3
        return (
            torch.randn(n, c, n + 2),
            torch.randn(c),
            torch.randn(c),
            torch.randn(c),
            torch.rand(c) + 0.5,
        )

    _check(f, make, SIZES, monkeypatch, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_a_loss_kept_whole_by_symbolic_tracing_is_decomposed(reduction, monkeypatch):
    # under the Python dispatcher (symbolic AOT tracing) torch's Python meta kept
    # binary_cross_entropy_with_logits whole: an ATen call at dynamic sizes only
    def f(x, y, w, pw):
        return F.binary_cross_entropy_with_logits(x, y, w, reduction=reduction, pos_weight=pw)

    def make(n):
        return torch.randn(n, 6) * 3, torch.rand(n, 6), torch.rand(n, 6), torch.rand(6) + 0.5

    _check(f, make, SIZES, monkeypatch, rtol=1e-4, atol=1e-5)


def test_logsigmoid_and_its_gradient_are_kernels(monkeypatch):
    # log_sigmoid_forward (and the buffer its backward reads) was an ATen call in both modes
    def f(x):
        x = x.detach().requires_grad_()
        y = F.logsigmoid(x)
        (g,) = torch.autograd.grad(y.sum(), x)
        return y, g

    _check(f, lambda n: (torch.randn(n, n + 1) * 4,), SIZES, monkeypatch, rtol=1e-5, atol=1e-6)


def test_a_float_size_argument_of_an_extern_call_is_computed_by_the_wrapper(monkeypatch):
    # matrix_rank's tolerance eps * max(m, n) reaches an ATen call as a SymFloat: the wrapper
    # could not print it, and the graph fell back to per-size builds
    def f(x):
        a = x @ x.mT
        return torch.linalg.matrix_rank(a, hermitian=True), torch.linalg.matrix_rank(x)

    kiln.reset()
    watch = Watch(monkeypatch)
    compiled = kiln.compile(f, dynamic=True, options={"warn_eager": False})
    for k, n in enumerate(SIZES):
        x = torch.randn(n + 2, n)
        x[:, 0] = x[:, 1]  # rank n - 1: the tolerance decides
        for g, e in zip(compiled(x), f(x), strict=True):
            assert torch.equal(g, e), (n, g, e)
        if k == 0:
            first = len(watch.built)
    assert watch.built and not any(isinstance(g, (Exception, Declined)) for g in watch.built), (
        watch.built
    )
    assert len(watch.built) == first, "one build serves every size"
