"""autograd/: captured torch-level FX graph -> functional ATen forward (and backward) graphs.

In: the backend contract `(gm, example_inputs)`. Out: a callable with eager's semantics whose
graphs went through `fw_compiler` / `bw_compiler` (the code generator, or eager kernels).

compile.py    `aot_compile`: the pipeline and the per-call-signature cache of entries
attention_masks.py  constant SDPA masks that mask nothing, or are causal, leave the call
float_inputs.py     float inputs (a learning rate) as 0-d tensors: new values reuse the entry
tensor_scalars.py   Scalar arguments given as tensors (optimizer step sizes) as tensor arithmetic
analyze.py    fake run of the captured graph: mutated inputs, output aliasing, grad mode
symbolic.py   symbolic sizes: capture's fake world to trace in
sizes.py      sizes and shape guards read per call (imports sympy: symbolic graphs only)
tracing.py    make_fx + functionalize: functional forward, joint fw/bw (vjp), inference graph
decomps.py    the decomposition table kiln traces with, and why each op is in it
partition.py  joint graph -> forward + backward graphs (min-cut or save-all)
mincut.py     the max-flow / min-cut that chooses what to save for the backward
runtime.py    the autograd.Function, mutation write-back, rebuilding aliased outputs
backend.py    the `aot_eager` backend
errors.py     refusals with a reason and a fix
"""

from .compile import aot_compile
from .decomps import default_decompositions
from .errors import AotUnsupported

__all__ = ["aot_compile", "default_decompositions", "AotUnsupported"]
