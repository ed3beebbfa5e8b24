"""kiln: a compiler for PyTorch programs. `kiln.compile(model)` has torch.compile's signature.

Stages (each a subpackage; see its __init__): capture/ (bytecode -> FX graph + guards),
autograd/ (ATen graphs, forward/backward split), backends/ (the registry and built-ins).
"""

from .api import (
    allow_in_graph,
    compile,
    disable,
    explain,
    is_compiling,
    list_backends,
    mark_dynamic,
    mark_step_begin,
    reset,
)
from .backends.registry import register_backend
from .logs import set_logs

__version__ = "0.1.0"

__all__ = [
    "allow_in_graph",
    "compile",
    "disable",
    "explain",
    "is_compiling",
    "list_backends",
    "mark_dynamic",
    "mark_step_begin",
    "register_backend",
    "reset",
    "set_logs",
]
