"""`lazy_exports`: a package's names imported from its submodules on first use.

Takes the package's `__name__` and a table {name: relative submodule}; gives the module-level
`__getattr__` (PEP 562) that imports the submodule when a name is first read and keeps the value
in the package's namespace, so later reads are plain lookups.

Why: loading a cached graph (codegen/cpp/load.py, codegen/triton/load.py) goes through
`kiln.codegen` and its device packages, which re-export the pipeline and the renderers; importing
those eagerly would import lowering, scheduling and sympy, which a warm start never needs.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
