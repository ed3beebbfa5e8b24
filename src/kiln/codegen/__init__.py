"""codegen/: the one compile pipeline and the built-in devices' code generators.

    kiln.codegen.compile_graph(gm, example_inputs, device=None, options=None,
                               *, checked_inputs=()) -> CompiledGraph | Declined

In: a functional ATen `torch.fx.GraphModule` and example inputs. Out: a `CompiledGraph` (a
callable taking the flat inputs and returning the outputs as a tuple — usable as
`fw_compiler`/`bw_compiler`) or `Declined(reason)`. The passes (pipeline.py) are the same for
every device: ATen rewrites -> lower -> schedule -> render -> wrap -> build; a device
(kiln.devices) supplies its rewrite list, capabilities and the last three passes.

Files: pipeline.py (the passes in order, `Declined`), compiled.py (`CompiledGraph`,
`eager_callable`), wrapper.py (the wrapper program, shared helpers), bindings.py (fast extern
bindings), cpp/ (the cpu device: C++/OpenMP), triton/ (the cuda device: Triton).
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports

# imported on first use: loading a cached graph (cpp/load.py, triton/load.py) must not import
# the pipeline, which imports lowering and scheduling (and sympy)
_WHERE = {
    "CompiledGraph": ".compiled",
    "eager_callable": ".compiled",
    "PASSES": ".pipeline",
    "Declined": ".pipeline",
    "DeviceUnavailable": ".pipeline",
    "compile_graph": ".pipeline",
    "compile_graph_strict": ".pipeline",
}


__getattr__ = lazy_exports(__name__, _WHERE)


__all__ = [
    "CompiledGraph",
    "Declined",
    "DeviceUnavailable",
    "PASSES",
    "compile_graph",
    "compile_graph_strict",
    "eager_callable",
]
