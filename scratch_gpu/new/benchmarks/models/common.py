"""The model contract of the benchmark suite: `BenchModel` and its factory.

Takes, per model, a function building the module for a size preset and a function making random
inputs for it; gives `BenchModel.factory(device, dtype, size, seed) -> (model, example_inputs)`
and `BenchModel.inputs(...)` for fresh random inputs of the same shapes (correctness is checked
on inputs the compiler has not seen). Everything is built in code from a seed: no downloads.

Size presets: "tiny" (tests and `kiln demo`), "small" (the 2-core CPU suite) and "large" (the
GPU suite). Floating-point inputs and parameters take the requested dtype; integer inputs
(token ids) stay integers. Dropout is always 0 so training steps are deterministic and can be
compared with eager exactly.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Callable

import torch

SIZES = ("tiny", "small", "large")

ModelFn = Callable[[str], torch.nn.Module]
InputsFn = Callable[[str, torch.Generator], tuple]


@dataclass(frozen=True)
class BenchModel:
    """One benchmark model: how to build it and its inputs at each size preset."""

    name: str
    description: str
    make_model: ModelFn  # size -> module (float32, cpu, random weights from torch's RNG)
    make_inputs: InputsFn  # (size, generator) -> tuple of cpu tensors
    requires: tuple[str, ...] = ()  # importable packages the model needs
    tags: tuple[str, ...] = field(default=())

    def missing(self) -> list[str]:
        """The required packages that are not installed (empty when the model can run)."""
        return [pkg for pkg in self.requires if importlib.util.find_spec(pkg) is None]

    def factory(
        self,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        size: str = "small",
        seed: int = 0,
    ) -> tuple[torch.nn.Module, tuple]:
        """(model in eval mode, example inputs) with weights and inputs drawn from `seed`."""
        _check_size(size)
        missing = self.missing()
        if missing:
            raise ModuleNotFoundError(f"{self.name} needs {', '.join(missing)}")
        torch.manual_seed(seed)
        model = self.make_model(size).to(device=device, dtype=dtype).eval()
        return model, self.inputs(device, dtype, size, seed)

    def inputs(
        self,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        size: str = "small",
        seed: int = 0,
    ) -> tuple:
        """Random inputs drawn from `seed` (a different seed gives fresh data, same shapes)."""
        _check_size(size)
        gen = torch.Generator().manual_seed(10_007 + seed)
        return tuple(_to(x, device, dtype) for x in self.make_inputs(size, gen))


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"unknown size preset {size!r}; choose one of {', '.join(SIZES)}")


def _to(x, device: str, dtype: torch.dtype):
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device)
    return x


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def token_ids(gen: torch.Generator, vocab: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=gen)


def pick(size: str, tiny, small, large):
    """The value for `size` among the three presets."""
    return {"tiny": tiny, "small": small, "large": large}[size]
