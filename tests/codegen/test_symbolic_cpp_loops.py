"""Kernels compiled for symbolic sizes keep the loop shapes of static ones (issue 31: a dynamic
entry's steady time within 10% of an entry compiled for one length).

Three differences made the symbolic attention layer slower than the static one: the reshape
of the softmax (`(b, h, t, t)` -> `(b*h, t, t)`, strides `t**2`) was not seen to be a view, so
the softmax was recomputed inside a copy with a division per element; the Q/K/V head splits,
one of them transposed, were fused into one flat loop (transposed reads were not seen through a
symbolic stride); and a row of symbolic length was never split into (rest) x (last
dimension), so each element's position took a division by a runtime size. Then the row's own
indices (`x/(4*s0)`), divisions by a runtime size inside the vectorized loops, kept GCC from
vectorizing the symbolic softmax at all (1.7x its static kernel's time). Each is checked on
the generated code, and the results against eager at many lengths.
"""

from __future__ import annotations

import re

import pytest
import sympy
import torch
from test_symbolic_cpp import _compare, _compile

from kiln.lower.indexing import FloorDiv, ModularIndexing, index_vars, linearize

HEADS, C = 4, 64  # head dimension 16: long enough to vectorize and to count as transposed


def attention(x, w):
    b, t, c = x.shape
    q, k, v = (x @ w).split(c, -1)
    q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
    att = (q @ k.transpose(-2, -1) * 0.25).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(b, t, c)


def test_a_reshape_over_a_square_stride_is_a_strided_view():
    s = sympy.Symbol("s0", integer=True, positive=True)
    i0, i1, i2 = index_vars(3)
    # (4, 4, s, s) read as (16, s, s): element (i0, i1, i2) is at i0*s**2 + i1*s + i2
    pos = linearize((FloorDiv(i0, 4), ModularIndexing(i0, 4), i1, i2), (4 * s**2, s**2, s, 1))
    assert sympy.expand(pos - (i0 * s**2 + i1 * s + i2)) == 0
    assert not pos.has(FloorDiv, ModularIndexing), pos


@pytest.mark.parametrize("first", [40, 9])
def test_attention_at_a_symbolic_length_divides_by_no_size_per_element(first):
    # `first`: the length the graph is compiled at (its size hint). At 9, shorter than a
    # transposed read must be to count, the K head split fused with Q and V into one loop with
    # a division by the length per element: a symbolic size counts as long, whatever its hint
    def make(t):
        return torch.randn(2, t, C), torch.randn(C, 3 * C) / 8

    compiled = _compile(attention, make(first), {0: (1,)})
    for t in (1, 3, 17, 40, 67):
        _compare(compiled, attention, make(t), rtol=1e-4, atol=1e-4)
    kernels = compiled.kernel_source.split('extern "C" void')[1:]
    # the position of an element within a row: from `ro`/`ri` loops, never `r / size`
    per_element = re.findall(r"= \(?r[/%][^;]*s\d+[^;]*;", "".join(kernels))
    assert not per_element, per_element
    # a row's indices over runtime sizes (`x/(4*s0)`) are computed once per row, outside the
    # vectorized loops: GCC does not vectorize an `omp simd` loop dividing by a runtime size
    in_loop = re.findall(
        r"const int64_t i\d+ = [^;]*\bx\b[^;]*[/%][^;]*\bs\d+[^;]*;", "".join(kernels)
    )
    assert not in_loop, in_loop
    softmax = [k for k in kernels if "std::exp" in k]
    assert len(softmax) == 1, "the softmax is one kernel, computed once"
    assert softmax[0].count("std::exp") == 1, softmax[0]


def test_column_sums_over_symbolic_strides_read_rows_in_order():
    """A bias gradient's sum over the tokens of a [tokens, features] tensor, with both sizes
    symbolic: the column layout (a block of columns summed row by row, vectorized along the
    row) needs the loads' steps, which are sizes here (`features` per token)."""

    def f(x, g):
        return (x * g).sum(0), x.sum(0)

    def make(n):
        return torch.randn(3 * n + 5, 2 * n + 9), torch.randn(3 * n + 5, 2 * n + 9)

    compiled = _compile(f, make(20), {0: (0, 1), 1: (0, 1)})
    for n in (0, 1, 4, 20, 37):
        _compare(compiled, f, make(n), rtol=1e-4, atol=1e-4)
    assert "xb += 64" in compiled.kernel_source, compiled.kernel_source[-2000:]


def test_column_sums_over_a_symbolic_length_index_once_per_position():
    """A bias gradient over (batch, length, features) sums over batch and length: the column
    layout's reduced position splits by the runtime length (`r/s0`, `r%s0`), once per position
    outside the vectorized loop over columns (inside it, GCC did not vectorize the loop)."""

    def f(x, g):
        return (x * g).sum((0, 1)), x.sum((0, 1))

    def make(n):
        return torch.randn(3, n, 64), torch.randn(3, n, 64)

    compiled = _compile(f, make(20), {0: (1,), 1: (1,)})
    for n in (1, 5, 20, 33):
        _compare(compiled, f, make(n), rtol=1e-4, atol=1e-4)
    src = compiled.kernel_source
    assert "xb += 64" in src, src[-2000:]
    in_loop = re.findall(r"const int64_t r\d+ = [^;]*\br\b[^;]*[/%][^;]*\bs\d+[^;]*;", src)
    assert not in_loop, in_loop
