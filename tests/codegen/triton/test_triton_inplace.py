"""Mutated inputs written in place by Triton kernels (schedule/inplace.py): given which outputs
are new values of inputs, the wrapper hands the input itself to the kernel and returns it; the
values are eager's, over calls with fresh inputs. Run under Triton's interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from tr_helpers import fresh_like, kernel_count, require_interpreter

pytestmark = pytest.mark.usefixtures("_interpreter")


@pytest.fixture
def _interpreter():
    require_interpreter()


def _adam_update(p, g, m, v):
    """Functional Adam-like step over two parameters of different shapes: new (p, m, v) each."""
    out = []
    for i in range(2):
        m2 = m[i].lerp(g[i], 0.1)
        v2 = v[i] * 0.999 + 0.001 * g[i] * g[i]
        out += [p[i] - 0.01 * m2 / (v2.sqrt() + 1e-8), m2, v2]
    return tuple(out)


def test_optimizer_update_writes_parameters_and_state_in_place():
    from kiln.codegen import compile_graph_strict

    def fn(p0, p1, g0, g1, m0, m1, v0, v1):
        return _adam_update((p0, p1), (g0, g1), (m0, m1), (v0, v1))

    shapes = [(37, 19), (300,)]

    def make():
        ts = [torch.randn(s) for s in shapes * 3] + [torch.rand(s) for s in shapes]
        return ts

    example = make()
    gm = make_fx(fn)(*example)
    # outputs (p0, m0, v0, p1, m1, v1) are the new values of inputs (0, 4, 6, 1, 5, 7)
    mutated = {0: 0, 1: 4, 2: 6, 3: 1, 4: 5, 5: 7}
    compiled = compile_graph_strict(gm, example, "cuda", mutated_inputs=mutated)
    assert kernel_count(compiled) <= 2  # one kernel per parameter shape
    for _ in range(2):
        args = [fresh_like(t) if i < 6 else fresh_like(t).abs() for i, t in enumerate(make())]
        expected = fn(*[a.clone() for a in args])
        outs = compiled(list(args))
        for j, i in mutated.items():
            assert outs[j] is args[i]  # the input itself, written by the kernel
            torch.testing.assert_close(args[i], expected[j])
