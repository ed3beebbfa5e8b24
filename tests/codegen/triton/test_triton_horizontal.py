"""Horizontal Triton kernels (codegen/triton/horizontal.py): independent pointwise kernels of
different sizes in one launch whose programs are split into a static range per part; results
equal eager's on fresh inputs, mutated inputs still written in place. Run under Triton's
interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from tr_helpers import check, fresh_like, kernel_count, kernel_source, require_interpreter

pytestmark = pytest.mark.usefixtures("_interpreter")


@pytest.fixture
def _interpreter():
    require_interpreter()


def test_independent_chains_of_different_sizes_are_one_launch():
    def fn(a, b, c):
        return a.sin() * 2 + 1, (b * b).cos() - b, torch.sigmoid(c) * c

    # 703, 300 and 2600 elements: parts of 1, 1 and 3 blocks, each masked at its own end
    compiled = check(fn, torch.randn(37, 19), torch.randn(300), torch.randn(20, 130))
    assert kernel_count(compiled) == 1
    src = kernel_source(compiled, "kernel0")
    assert "if gpid < 1:" in src and "if (gpid >= 1) & (gpid < 2):" in src
    assert "if (gpid >= 2) & (gpid < 5):" in src
    assert "kernel0[(5,)]" in compiled.wrapper_source


def test_dependent_kernels_stay_two_launches():
    def fn(x, y):
        a = x.sin() * 3
        return a, a.reshape(-1)[:50] + y

    compiled = check(fn, torch.randn(7, 13), torch.randn(50))
    assert kernel_count(compiled) == 2


def test_adam_like_update_over_many_shapes_is_one_kernel_written_in_place():
    from kiln.codegen import compile_graph_strict

    # (no one-element tensor: fusion places it as a per-row member of another size's kernel,
    # which is not a part: schedule/horizontal.py)
    shapes = [(37, 19), (300,), (5, 7, 11), (3,), (2049,)]
    n = len(shapes)

    def fn(*ts):
        p, g, m, v = ts[:n], ts[n : 2 * n], ts[2 * n : 3 * n], ts[3 * n :]
        out = []
        for i in range(n):
            m2 = m[i].lerp(g[i], 0.1)
            v2 = v[i] * 0.999 + 0.001 * g[i] * g[i]
            out += [p[i] - 0.01 * m2 / (v2.sqrt() + 1e-8), m2, v2]
        return tuple(out)

    def make():
        return [torch.randn(s) for s in shapes * 3] + [torch.rand(s) for s in shapes]

    example = make()
    # outputs (p_i, m_i, v_i) are the new values of inputs (i, 2n + i, 3n + i)
    mutated = {}
    for i in range(n):
        mutated.update({3 * i: i, 3 * i + 1: 2 * n + i, 3 * i + 2: 3 * n + i})
    compiled = compile_graph_strict(make_fx(fn)(*example), example, "cuda", mutated_inputs=mutated)
    assert kernel_count(compiled) == 1
    for _ in range(2):
        args = [fresh_like(t) if i < 3 * n else fresh_like(t).abs() for i, t in enumerate(make())]
        expected = fn(*[a.clone() for a in args])
        outs = compiled(list(args))
        for j, i in mutated.items():
            assert outs[j] is args[i]
            torch.testing.assert_close(args[i], expected[j])
