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


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_input_read_again_in_a_later_pass_is_not_overwritten(device):
    """A one-row kernel over a long tensor: the new value of input `m` is a member of its first
    pass; a one-value member (a bias correction from a step count, stored once rather than
    recomputed per element) comes next, and the update reading both runs in a second pass,
    where the renderer recomputes `m`'s new value from `m`. Written into `m` in the first pass,
    that recomputation read the new value and applied the update twice (Adam's moments over a
    5000-element parameter on the Triton interpreter)."""
    from kiln.codegen import compile_graph_strict

    def fn(p, g, m, step):
        m2 = m.lerp(g, 0.1)
        corr = torch.sqrt(1 - torch.pow(0.999, step + 1))
        return p - 0.01 * m2 / corr, m2

    def make():
        return [torch.randn(5000), torch.randn(5000), torch.randn(5000), torch.tensor(3.0)]

    example = make()
    gm = make_fx(fn)(*example)
    compiled = compile_graph_strict(gm, example, device, mutated_inputs={0: 0, 1: 2})
    for _ in range(2):
        args = make()
        expected = fn(*[a.clone() for a in args])
        outs = compiled(list(args))
        torch.testing.assert_close(outs[0], expected[0])
        torch.testing.assert_close(args[2] if outs[1] is args[2] else outs[1], expected[1])


def test_one_value_intermediates_are_kept_and_returned_ones_are_not():
    """One-value intermediates live in a block the wrapper keeps between calls (schedule/arena.py
    `plan_small_arena`): the same memory every call, so a returned one-value result, which the
    caller keeps, must not be among them; a second call leaves the first call's results as
    they were, and both are eager's."""
    from kiln.codegen import compile_graph_strict

    def fn(x, y, t):
        # kept: a sum read by every element of x and y (a one-value pointwise is recomputed by
        # each reader's programs on the GPU: schedule/realize.py)
        corr = torch.sqrt(1 + (t * t).sum())
        top = (x / corr).amax()  # returned: allocated per call
        return x / corr + top, top, y * corr

    def make():
        return [torch.randn(5000), torch.randn(4500), torch.randn(7)]

    example = make()
    compiled = compile_graph_strict(make_fx(fn)(*example), example, "cuda")
    assert "_take_kept(" in compiled.wrapper_source
    first_args = make()
    first = [o.clone() for o in compiled(list(first_args))]
    kept_first = compiled(list(first_args))
    second_args = make()
    second = compiled(list(second_args))
    for got, want in zip(kept_first, fn(*first_args)):
        torch.testing.assert_close(got, want)
    for got, want in zip(kept_first, first):
        torch.testing.assert_close(got, want)
    for got, want in zip(second, fn(*second_args)):
        torch.testing.assert_close(got, want)
