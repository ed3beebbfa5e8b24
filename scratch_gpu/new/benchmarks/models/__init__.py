"""The benchmark model suite: every model `kiln bench` can run, by name.

Gives `MODELS: dict[str, BenchModel]` (see common.py for the contract:
`MODELS[name].factory(device, dtype, size, seed) -> (model, example_inputs)` and
`.inputs(...)` for fresh random inputs). Models are defined in code with random weights:
basic.py (MLP, pointwise chain, softmax + layer norm, ResNet-style CNN), nanogpt.py (a GPT-2
style decoder), decode.py (a GPT-2 decode step against a KV cache) and hub.py (transformers /
torchvision / timm models, skipped with a reason when their package is missing).
The runner in `src/kiln/bench/` loads this package by path.
"""

from __future__ import annotations

from . import basic, decode, hub, nanogpt
from .common import SIZES, BenchModel

MODELS: dict[str, BenchModel] = {
    **basic.MODELS,
    **nanogpt.MODELS,
    **decode.MODELS,
    **hub.MODELS,
}

__all__ = ["MODELS", "SIZES", "BenchModel"]
