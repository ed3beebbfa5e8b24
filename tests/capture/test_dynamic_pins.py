"""Sizes that only flow into kernels must not pin a length (issue 31).

Each program reads a dynamic size through everyday Python (library code does all of these: a
float scale `1.0 / n`, `int(x.shape[1])`, `min(n, cap)`, padding to a multiple with
`math.ceil(n / 8) * 8`, `round`, a float-step `arange`) and must compile once for every length
under `dynamic=True`, with every result equal to eager's. Before the fix, `1.0 / n` was
computed by float's own method from the first length and kept for every length (a wrong
answer), the conversions pinned the length (an entry per length), and a shape fact written
with `math.`/`torch.` raised NameError in the guard, missing on every call.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from harness import CountingBackend

import kiln


def scale_by_float(x):
    return x * (1.0 / x.shape[1])


def compare_with_float(x):
    return x * 2 if 6.5 < x.shape[1] else x


def int_of_size(x):
    return x.view(x.shape[0], int(x.shape[1]), -1) * 2


def float_of_size(x):
    return x * float(x.shape[1])


def capped(x):
    return x[:, : min(x.shape[1], 64)] + max(1, x.shape[1] - 100)


def pad_to_multiple(x):
    n = x.shape[1]
    return F.pad(x, (0, 0, 0, math.ceil(n / 8) * 8 - n))


def half_rounded(x):
    return x[:, : round(x.shape[1] / 2)]


def float_step_arange(x):
    return torch.arange(0, x.shape[1], 1.0) * x.sum(-1)


_W = torch.randn(6, 4)


def matmul_without_grad(x):
    # Under no_grad (the test runs the program there) ATen's C++ matmul reads concrete sizes to
    # decide whether to fold the batch into one mm (torch 2.11): on symbolic sizes that either
    # failed ("Cannot call numel() on tensor with symbolic sizes") or pinned the length.
    return torch.matmul(x, _W.t()).relu()


def linear_without_bias(x):
    return F.linear(x, _W) * 2


def index_of_size(x):
    import operator

    return x.new_zeros(operator.index(x.shape[1])) + x.sum((0, 2))


PROGRAMS = [
    scale_by_float,
    int_of_size,
    float_of_size,
    capped,
    pad_to_multiple,
    half_rounded,
    float_step_arange,
    index_of_size,
]

# Run under torch.no_grad: the C++ composites read sizes when no operand needs a gradient.
NO_GRAD_PROGRAMS = [matmul_without_grad, linear_without_bias]


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_one_compile_serves_every_length(fn):
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend, dynamic=True)
    for n in (5, 7, 11, 13):
        x = torch.randn(2, n, 4)
        torch.testing.assert_close(compiled(x), fn(x))
    assert len(backend.graphs) == 1


@pytest.mark.parametrize("fn", NO_GRAD_PROGRAMS, ids=lambda f: f.__name__)
def test_aten_composites_do_not_pin_the_length(fn):
    """Capture's fake propagation runs C++ composite kernels through the Python dispatcher's
    SymInt-aware decompositions, so neither a break nor a pinned length (torch 2.11; newer
    releases fixed matmul's C++ check themselves)."""
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend, dynamic=True)
    with torch.no_grad():
        for n in (5, 7, 11, 13):
            x = torch.randn(2, n, 4)
            torch.testing.assert_close(compiled(x), fn(x))
    assert len(backend.graphs) == 1


def test_a_float_compared_with_a_length_guards_the_outcome():
    backend = CountingBackend()
    compiled = kiln.compile(compare_with_float, backend=backend, dynamic=True)
    for n in (5, 6, 7, 11):  # one entry per side of 6.5 (before: the first side for all)
        x = torch.randn(2, n, 4)
        torch.testing.assert_close(compiled(x), compare_with_float(x))
    assert len(backend.graphs) == 2


def test_min_guards_the_outcome_not_the_length():
    backend = CountingBackend()
    compiled = kiln.compile(capped, backend=backend, dynamic=True)
    for n in (5, 7, 70, 90, 9):  # below the cap, then above: one entry per side
        x = torch.randn(2, n, 4)
        torch.testing.assert_close(compiled(x), capped(x))
    assert len(backend.graphs) == 2
