"""codegen/cpp/: the C++/OpenMP renderer of the cpu device.

In: a `Schedule`. Out: `CppModule` — one translation unit holding every kernel of the graph.
Files: ops.py (dtype/op/constant tables and the prelude), renderer.py (kernel loops).
"""

from .renderer import CppKernel, CppModule, render_module

__all__ = ["CppKernel", "CppModule", "render_module"]
