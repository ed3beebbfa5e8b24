"""Small hand-written benchmark models: a deep MLP, a pointwise chain, softmax + layer norm, and
a ResNet-style CNN.

Takes a size preset ("tiny", "small", "large"); gives modules and input makers registered as
`BenchModel`s in `MODELS`. They isolate the things a compiler is judged on: fusing pointwise
work into matmul epilogues (mlp), memory-bound fusion (pointwise), reductions fused with their
producers and consumers (softmax_ln), and convolutions with batch norm (resnet).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import BenchModel, pick, randn


class MLPBlock(nn.Module):
    """Linear -> GELU -> Linear, a residual add, then LayerNorm."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(F.gelu(self.up(x))))


class DeepMLP(nn.Module):
    """`depth` MLP blocks and a linear head."""

    def __init__(self, dim: int, hidden: int, depth: int):
        super().__init__()
        self.blocks = nn.Sequential(*(MLPBlock(dim, hidden) for _ in range(depth)))
        self.head = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def _mlp_dims(size: str) -> tuple[int, int, int, int]:
    """(batch, dim, hidden, depth)"""
    return pick(size, (8, 32, 64, 2), (64, 512, 2048, 4), (256, 2048, 8192, 8))


class PointwiseChain(nn.Module):
    """A dozen elementwise ops over two tensors and a learned scale: memory-bound when unfused."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim) * 0.1 + 1.0)
        self.shift = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = torch.sigmoid(x) * x + torch.tanh(y) * 0.5
        b = torch.exp(-a.abs()) - torch.cos(y)
        c = F.gelu(a * self.scale + self.shift) + b * b
        return torch.clamp(c, -3.0, 3.0) * torch.rsqrt(1.0 + y * y)


def _pointwise_dims(size: str) -> tuple[int, int]:
    return pick(size, (8, 32), (512, 2048), (8192, 8192))


class SoftmaxLayerNorm(nn.Module):
    """Scaled softmax over the last dimension, then a layer norm and a residual add."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(x * 0.125, dim=-1)
        return self.norm(p * x.shape[-1]) + x


def _softmax_dims(size: str) -> tuple[int, int, int]:
    return pick(size, (2, 8, 32), (16, 256, 512), (64, 1024, 2048))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNetStyle(nn.Module):
    """A ResNet-18-shaped CNN: stem, four stages of basic blocks, pooling, classifier."""

    def __init__(self, widths: tuple[int, ...], blocks_per_stage: int, classes: int):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            for j in range(blocks_per_stage):
                layers.append(BasicBlock(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _resnet_dims(size: str):
    """(batch, image side, widths, blocks per stage, classes)"""
    return pick(
        size,
        (2, 16, (8, 16), 1, 10),
        (8, 32, (16, 32, 64, 128), 2, 100),
        (64, 224, (64, 128, 256, 512), 2, 1000),
    )


def _mlp_b64_dims(size: str) -> tuple[int, int, int, int]:
    """(batch, dim, hidden, depth): the speed issue's small-batch MLP, 4 x (Linear 1024->4096,
    GELU, Linear 4096->1024, LayerNorm) at batch 64: launch- and GEMM-epilogue-bound."""
    return pick(size, (8, 32, 64, 2), (16, 256, 1024, 2), (64, 1024, 4096, 4))


def _mlp_b64_model(size: str) -> nn.Module:
    _, dim, hidden, depth = _mlp_b64_dims(size)
    return DeepMLP(dim, hidden, depth)


def _mlp_b64_inputs(size: str, gen: torch.Generator) -> tuple:
    batch, dim, _, _ = _mlp_b64_dims(size)
    return (randn(gen, batch, dim),)


def _mlp_model(size: str) -> nn.Module:
    _, dim, hidden, depth = _mlp_dims(size)
    return DeepMLP(dim, hidden, depth)


def _mlp_inputs(size: str, gen: torch.Generator) -> tuple:
    batch, dim, _, _ = _mlp_dims(size)
    return (randn(gen, batch, dim),)


def _pointwise_model(size: str) -> nn.Module:
    return PointwiseChain(_pointwise_dims(size)[1])


def _pointwise_inputs(size: str, gen: torch.Generator) -> tuple:
    rows, dim = _pointwise_dims(size)
    return (randn(gen, rows, dim), randn(gen, rows, dim))


def _softmax_model(size: str) -> nn.Module:
    return SoftmaxLayerNorm(_softmax_dims(size)[2])


def _softmax_inputs(size: str, gen: torch.Generator) -> tuple:
    return (randn(gen, *_softmax_dims(size)),)


def _resnet_model(size: str) -> nn.Module:
    _, _, widths, blocks, classes = _resnet_dims(size)
    return ResNetStyle(widths, blocks, classes)


def _resnet_inputs(size: str, gen: torch.Generator) -> tuple:
    batch, side, _, _, _ = _resnet_dims(size)
    return (randn(gen, batch, 3, side, side),)


MODELS = {
    m.name: m
    for m in (
        BenchModel("mlp", "deep MLP: Linear/GELU/Linear/LayerNorm blocks", _mlp_model, _mlp_inputs),
        BenchModel(
            "mlp_b64", "the MLP blocks at batch 64, dim 1024", _mlp_b64_model, _mlp_b64_inputs
        ),
        BenchModel(
            "pointwise", "chain of a dozen elementwise ops", _pointwise_model, _pointwise_inputs
        ),
        BenchModel(
            "softmax_ln",
            "softmax, then layer norm and residual",
            _softmax_model,
            _softmax_inputs,
        ),
        BenchModel("resnet", "ResNet-18-style CNN with batch norm", _resnet_model, _resnet_inputs),
    )
}
