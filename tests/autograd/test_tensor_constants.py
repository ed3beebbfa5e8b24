"""Graphs whose joint graph holds tensor constants (make_fx's `_tensor_constantN`, from a
`torch.tensor(...)` of Python numbers in the program: GPT-Neo's and Falcon's masks, GPT-2's
loss) go through AOT autograd: the forward and the backward each fetch the constants they
read, nothing falls back to eager kernels, and results and gradients equal eager's."""

import pytest
import torch
from aot_helpers import trains_like_eager


def _program(x, w):
    scale = torch.tensor([2.0, 3.0, 0.5])  # a constant the backward reads too
    y = (x @ w) * scale
    mask = torch.tensor([True, False, True])
    return torch.where(mask, y.sin(), y * torch.tensor(-1.5)).sum(0)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_tensor_constants_in_forward_and_backward(backend):
    cf = trains_like_eager(_program, [(4, 5), (5, 3)], backend)
    state = cf._kiln_compiled
    assert state.eager_reason is None and not state.breaks
    assert len(state.graph_modules) == 1
