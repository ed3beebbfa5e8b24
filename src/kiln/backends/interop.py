"""`torch.compile(m, backend="kiln")`: kiln's compiler behind TorchDynamo's capture.

Registered through the `torch_dynamo_backends` entry point in pyproject.toml. It receives a
graph captured by TorchDynamo and compiles it exactly as kiln's own capture would hand it on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .registry import lookup_backend


def kiln_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    from . import builtin  # noqa: F401  (registers the built-in backends)

    return lookup_backend("inductor")(gm, example_inputs)
