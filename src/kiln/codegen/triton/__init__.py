"""codegen/triton/: the code generator of the cuda device — scheduled loop IR -> Triton kernels.

In: a `Schedule` (from the one pipeline, codegen/pipeline.py). Out: `TritonModule` (kernel
source and launch plans) and the wrapper program; device.py builds them into a callable.

Files: ops.py (Triton tables and helper prelude), indexing.py (block index expressions),
heuristics.py (kernel kinds, block sizes, warps), split.py (reductions split across programs),
renderer.py (kernels), wrapper.py (the Python program), device.py (the `CodeGen` the cuda device
names). The builder is runtime/triton_builder.py.
"""

from .renderer import TritonKernel, TritonModule, render_module
from .wrapper import render_wrapper

__all__ = ["TritonKernel", "TritonModule", "render_module", "render_wrapper"]
