"""kiln's built-in backends: `eager`, `aot_eager` and `inductor`.

`eager` runs the captured torch-level graph as it is. `aot_eager` traces it to ATen with
kiln's ahead-of-time autograd and runs eager ATen kernels. `inductor` is kiln's code
generator; until that stage lands it runs the `eager` path and says so once in the logs.
"""

from __future__ import annotations

import torch

from .. import logs
from .registry import register_backend, register_lazy


@register_backend(name="eager")
def eager(gm: torch.fx.GraphModule, example_inputs: list):
    return gm.forward


@register_backend(name="inductor")
def inductor(gm: torch.fx.GraphModule, example_inputs: list):
    logs.once(
        "inductor-routes-to-eager",
        "perf_hints",
        "backend='inductor': kiln's code generator has not landed yet; graphs run on the "
        "'eager' backend (the captured graph, eager kernels).",
    )
    return eager(gm, example_inputs)


register_lazy("aot_eager", "kiln.autograd.backend:aot_eager")
