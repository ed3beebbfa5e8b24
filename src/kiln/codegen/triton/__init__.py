"""codegen/triton/: the code generator of the cuda device — scheduled loop IR -> Triton kernels.

In: a `Schedule` (from the one pipeline, codegen/pipeline.py). Out: `TritonModule` (kernel
source and launch plans) and the wrapper program; device.py builds them into a callable.

Files: ops.py (Triton tables and helper prelude), indexing.py (block index expressions),
heuristics.py (kernel kinds, block sizes, warps), split.py (reductions split across programs),
renderer.py (kernels), wrapper.py (the Python program), device.py (the `CodeGen` the cuda device
names), load.py (a built graph loaded from its data). The builder is runtime/triton_builder.py.
"""

from __future__ import annotations

from ...lazy_exports import lazy_exports

# imported on first use: load.py (a cached graph's load) must not import the renderer
_WHERE = {
    "TritonKernel": ".kernel",
    "TritonModule": ".kernel",
    "render_module": ".module",
    "render_wrapper": ".wrapper",
}


__getattr__ = lazy_exports(__name__, _WHERE)


__all__ = ["TritonKernel", "TritonModule", "render_module", "render_wrapper"]
