"""`torch.autograd.Function`s inside compiled code keep their own backward: old style
(`forward(ctx, ...)`, no `setup_context`), new style, and a custom op whose backward is
registered with `torch.library.register_autograd` (torch makes an old-style Function of it:
Mixtral's `transformers::grouped_mm_fallback`). Each backward is deliberately not the
analytical derivative of its forward, so a compiler that differentiates the forward instead
fails. Compared with eager on fresh inputs; no fallback to eager kernels."""

import pytest
import torch
from aot_helpers import trains_like_eager

from kiln.backends import builtin


class OldStyle(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return (g @ w.t()) * 2, x.t() @ g


class NewStyle(torch.autograd.Function):
    @staticmethod
    def forward(x, w):
        return x @ w

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w.t(), (x.t() @ g) * 3


@torch.library.custom_op("kilntest::scaled_mm", mutates_args=())
def scaled_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


@scaled_mm.register_fake
def _(x, w):
    return x.new_empty(x.shape[0], w.shape[1])


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, g):
    x, w = ctx.saved_tensors
    return (g @ w.t()) * 0.5, x.t() @ g


scaled_mm.register_autograd(_backward, setup_context=_setup)

APPLY = {
    "old_style": OldStyle.apply,
    "new_style": NewStyle.apply,
    "custom_op": torch.ops.kilntest.scaled_mm,
}


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("kind", sorted(APPLY))
def test_autograd_function_keeps_its_backward(kind, backend):
    apply = APPLY[kind]

    def prog(x, w):
        return apply(x.sin(), w).tanh().sum(0)

    before = len(builtin.fallbacks())
    cf = trains_like_eager(prog, [(3, 4), (4, 5)], backend)
    with torch.no_grad():
        x, w = torch.randn(3, 4), torch.randn(4, 5)
        torch.testing.assert_close(cf(x, w), prog(x, w))
    assert builtin.fallbacks()[before:] == []
    state = cf._kiln_compiled
    assert state.eager_reason is None and not state.breaks
