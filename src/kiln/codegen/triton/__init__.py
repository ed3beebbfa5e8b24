"""codegen/triton/: the code generator of the cuda device — scheduled loop IR -> Triton kernels.

In: a `Schedule` (from the one pipeline, codegen/pipeline.py). Out: `TritonModule` (kernel
source and launch plans) and the wrapper program; device.py builds them into a callable.

Files: ops.py (Triton tables and helper prelude), indexing.py (block index expressions),
heuristics.py (kernel kinds, block sizes, warps), split.py (reductions split across programs),
renderer.py (kernels), wrapper.py (the Python program), device.py (the `CodeGen` the cuda device
names), load.py (a built graph loaded from its data). The builder is runtime/triton_builder.py.
"""

from __future__ import annotations

import importlib
from typing import Any

# imported on first use: load.py (a cached graph's load) must not import the renderer
_WHERE = {
    "TritonKernel": ".renderer",
    "TritonModule": ".renderer",
    "render_module": ".renderer",
    "render_wrapper": ".wrapper",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


__all__ = ["TritonKernel", "TritonModule", "render_module", "render_wrapper"]
