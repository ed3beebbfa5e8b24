"""codegen/cpp/: the C++/OpenMP renderer of the cpu device.

In: a `Schedule`. Out: `CppModule` — one translation unit holding every kernel of the graph.
Files: ops.py (dtype/op/constant tables and the prelude), renderer.py (kernel loops), device.py
(the `CodeGen` the cpu device names), load.py (a built graph loaded from its data).
"""

from __future__ import annotations

from ...lazy_exports import lazy_exports

# imported on first use: load.py (a cached graph's load) must not import the renderer
_WHERE = {
    "CppKernel": ".renderer",
    "CppModule": ".renderer",
    "render_module": ".module",
}


__getattr__ = lazy_exports(__name__, _WHERE)


__all__ = ["CppKernel", "CppModule", "render_module"]
