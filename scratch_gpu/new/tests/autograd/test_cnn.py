"""A CNN with BatchNorm through aot_eager, in train mode (running statistics are mutated
inputs, written back) and eval mode, against eager: outputs, gradients, buffers."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from aot_helpers import clone_inputs, compare, lift

from kiln.autograd.backend import aot_eager, aot_eager_decomp_partition

BACKENDS = [aot_eager, aot_eager_decomp_partition]


class BatchNorm2d(nn.BatchNorm2d):
    """nn.BatchNorm2d minus its input-rank check, which torch.fx cannot trace (`if x.dim()`)."""

    def _check_input_dim(self, input):
        pass


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)
        self.bn2 = BatchNorm2d(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.max_pool2d(h, 2) + F.avg_pool2d(h, 2)
        h = F.relu(self.bn2(self.conv2(h)))
        return (self.head(h.mean((2, 3))),)


def _fresh_cnn(train: bool) -> CNN:
    model = CNN().train(train)
    with torch.no_grad():  # non-trivial running statistics, so eval mode is really tested
        for bn in (model.bn1, model.bn2):
            bn.running_mean.copy_(torch.randn_like(bn.running_mean) * 0.1)
            bn.running_var.copy_(torch.rand_like(bn.running_var) + 0.5)
            bn.weight.copy_(torch.rand_like(bn.weight) + 0.5)
            bn.bias.copy_(torch.randn_like(bn.bias) * 0.1)
    return model


@pytest.mark.parametrize(
    "backend", [aot_eager, aot_eager_decomp_partition], ids=lambda b: b.__name__
)
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_cnn_batchnorm(train, backend):
    gm, state = lift(_fresh_cnn(train), 1)
    x = torch.randn(4, 3, 12, 12, requires_grad=True)
    compare(gm, [x, *state], backend=backend, atol=1e-5, rtol=1e-4)


def test_batchnorm_running_stats_written_back_into_buffers():
    model = _fresh_cnn(True)
    gm, state = lift(model, 1)
    names = gm.lifted_names
    assert "bn1.running_mean" in names and "bn2.running_var" in names
    before = clone_inputs(state)
    x = torch.randn(4, 3, 12, 12)
    compiled = aot_eager(gm, clone_inputs([x, *state]))
    ref_state = clone_inputs(state)
    for _ in range(3):
        x = torch.randn(4, 3, 12, 12)
        compiled(x, *state)[0].sum().backward()
        gm(x, *ref_state)[0].sum().backward()
    for name, got, ref, old in zip(names, state, ref_state, before):
        if "running" in name:
            assert not torch.allclose(got, old), f"{name} was not updated"
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)
    # the module's own buffers are the ones updated (no copies were made)
    assert model.bn1.running_mean is state[names.index("bn1.running_mean")]


def test_batchnorm_inference_under_no_grad():
    gm, state = lift(_fresh_cnn(False), 1)
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        compiled = aot_eager(gm, clone_inputs([x, *state]))
        got = compiled(x, *state)[0]
        ref = gm(x, *state)[0]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)
    assert not got.requires_grad
