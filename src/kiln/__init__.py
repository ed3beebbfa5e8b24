"""kiln: a compiler for PyTorch programs. `kiln.compile(model)` has torch.compile's signature.

Stages (each a subpackage; see its __init__ and docs/architecture.md): capture/ (bytecode -> FX
graph + guards), backends/ (the registry and built-ins), autograd/ (ATen graphs, forward/backward
split), rewrites/ (named ATen rewrites), lower/ (loop IR), schedule/ (kernels and memory plan),
codegen/ (the one pipeline; C++ and Triton renderers), devices/ (compile targets), runtime/
(builders, caches, device graphs).
"""

from .api import (
    allow_in_graph,
    compile,
    disable,
    explain,
    is_compiling,
    list_backends,
    load_cache_artifacts,
    mark_dynamic,
    mark_static,
    mark_step_begin,
    maybe_mark_dynamic,
    reset,
    save_cache_artifacts,
)
from .backends.registry import register_backend
from .capture.errors import KilnEagerWarning, KilnRecompileLimitWarning
from .devices import register_device
from .logs import set_logs
from .version import __version__

__all__ = [
    "__version__",
    "allow_in_graph",
    "compile",
    "disable",
    "explain",
    "is_compiling",
    "KilnEagerWarning",
    "KilnRecompileLimitWarning",
    "list_backends",
    "load_cache_artifacts",
    "mark_dynamic",
    "mark_static",
    "mark_step_begin",
    "maybe_mark_dynamic",
    "register_backend",
    "register_device",
    "reset",
    "save_cache_artifacts",
    "set_logs",
]
