"""lower/: functional ATen FX graph -> loop IR.

In: a `torch.fx.GraphModule` of `torch.ops.aten` calls (from `make_fx`) and example inputs.
Out: a `LoopGraph` (ir.py) of `Input`, `Constant`, `Pointwise`, `Reduction`, `View`, `Extern`
nodes whose sizes and indices are sympy expressions.

Files: ir.py (the nodes), indexing.py (index arithmetic and its printer), ops.py (the scalar
op vocabulary), registry.py (the self-checking lowering registry), context.py (what lowerings
use), pointwise.py / reductions.py / views.py / indirect.py (the lowerings; indirect.py's read
at indices loaded from memory), cse.py (calls that repeat earlier ones, merged before lowering),
graph.py (the walk over the FX graph), verify.py (the IR verifier), symbolic.py (SymInt sizes
as expressions) and hints.py (the sizes first seen, for speed-only decisions).
"""

from . import indirect, pointwise, pooling, reductions, views  # noqa: F401  (the lowerings)
from .graph import EXTERN_COUNTS, GraphUnsupported, extern_summary, lower_graph
from .ir import LoopGraph
from .registry import Unsupported, register_lowering, registered_ops
from .verify import IRError, verify

__all__ = [
    "EXTERN_COUNTS",
    "GraphUnsupported",
    "IRError",
    "LoopGraph",
    "Unsupported",
    "extern_summary",
    "lower_graph",
    "register_lowering",
    "registered_ops",
    "verify",
]
