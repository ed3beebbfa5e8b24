"""codegen/cpp/: the C++/OpenMP renderer of the cpu device.

In: a `Schedule`. Out: `CppModule` — one translation unit holding every kernel of the graph.
Files: ops.py (dtype/op/constant tables and the prelude), renderer.py (kernel loops), device.py
(the `CodeGen` the cpu device names), load.py (a built graph loaded from its data).
"""

from __future__ import annotations

import importlib
from typing import Any

# imported on first use: load.py (a cached graph's load) must not import the renderer
_WHERE = {
    "CppKernel": ".renderer",
    "CppModule": ".renderer",
    "render_module": ".renderer",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


__all__ = ["CppKernel", "CppModule", "render_module"]
