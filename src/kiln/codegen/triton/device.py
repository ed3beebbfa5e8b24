"""The cuda device's code generator: Triton kernels, launched from a Python wrapper program.

Takes a `Schedule` (render), the kernels (wrap) and the rendered module (build); gives the
Triton source, the wrapper program and, loaded by runtime/triton_builder.py (compile workers,
on-disk cache), the wrapper's `call`. Inputs may be CUDA tensors (the GPU) or CPU tensors
(Triton's interpreter, `TRITON_INTERPRET=1`, which the tests use: compile with
`device="cuda"`); buffers are allocated on the inputs' device. The device itself (its rewrites
and capabilities) is described in devices/builtin.py.

Why it exists: the pipeline (codegen/pipeline.py) is the same for every device; this is the
small part that is Triton's.
"""

from __future__ import annotations

import torch

from ...devices import Loadable, accelerator_of
from ...lower.ir import LoopGraph
from ...lower.symbolic import hint, using_hints
from ...runtime.triton_builder import TritonNotFound, prestart, require_triton
from ...runtime.triton_interpret import is_interpreting
from ..bindings import op_names
from .kernel import TritonKernel, TritonModule
from .load import load
from .module import render_module
from .wrapper import render_wrapper


class TritonCodeGen:
    """The cuda device's render, wrap and build passes (devices.CodeGen)."""

    kernel_language = "Triton"

    def unavailable(self) -> str | None:
        try:
            require_triton()
        except TritonNotFound as e:
            return str(e)
        return None

    def start(self, options) -> None:
        prestart()  # compile workers start while the graph is lowered and scheduled

    def render(self, sched, options) -> TritonModule:
        emulate = options.get("triton.emulate_precision_casts") if options is not None else False
        return render_module(sched, emulate_casts=emulate, interpret=is_interpreting())

    def wrap(self, sched, kernels: TritonModule, checked_inputs, capabilities):
        return render_wrapper(sched, {k.name: k for k in kernels.kernels}, checked_inputs)

    def loadable(self, kernels: TritonModule, wrapper, sched, example_inputs):
        """The build as data (load.py loads it): the module source, its kernels' launch plans,
        the wrapper and where it allocates; None when an extern is not an ATen overload (such
        a graph is built, but not kept by the compiled-artifact cache)."""
        externs = op_names(wrapper.externs)
        if externs is None:
            return None
        return Loadable(LOADER, _data(kernels, wrapper, sched, example_inputs, externs))

    def build(self, kernels: TritonModule, wrapper, sched, example_inputs):
        return load(_data(kernels, wrapper, sched, example_inputs, dict(wrapper.externs)))


LOADER = "kiln.codegen.triton.load:load"


def _data(kernels: TritonModule, wrapper, sched, example_inputs, externs: dict) -> dict:
    graph = sched.graph
    return {
        "source": kernels.source,
        "kernels": [k.name for k in kernels.kernels],
        "launches": _launches(kernels, graph),
        "wrapper": wrapper.source,
        "externs": externs,
        "constants": dict(graph.constants),
        "device": str(_graph_device(example_inputs, graph)),
    }


TRITON = TritonCodeGen()


def _launches(module: TritonModule, graph: LoopGraph) -> dict:
    nodes = graph.node_map()

    def dtype(name):
        n = nodes[name]
        return n.dtype if hasattr(n, "dtype") else n.layout.dtype

    # split reductions' scratch buffers (split.py), read by their `_sum` kernels too
    scratch = {name: dt for k in module.kernels for name, _, dt in k.workspaces}
    symbols = {str(s): s for s in graph.hints}
    # looped twins run only for rows longer than the sizes first seen: compiled at their first
    # launch, if one comes, not ahead with the rest
    twins = {k.looped.name for k in module.kernels if k.looped is not None}
    out, seen = {}, set()
    with using_hints(graph.hints):
        for k in module.kernels:
            k: TritonKernel
            if k.name in twins:
                continue
            dts = [scratch[p] if p in scratch else dtype(p) for p in k.params]
            # size arguments at their hints: the parallel compile builds the kernel Triton
            # specializes for the sizes first seen (int arguments divisible by 16, or 1)
            dts += [hint(symbols.get(name, name)) for name in k.sizes]
            p = k.plan
            # a kernel with the code of an earlier one compiles to the same binary when launched
            # with the same argument types and options: that binary is compiled once
            key = module.same_as.get(k.name, k.name)
            variant = (key, tuple(map(str, dts)), repr(p.constexprs), p.num_warps)
            if variant not in seen:
                seen.add(variant)
                grid = tuple(hint(g) for g in p.grid)
                out[k.name] = (dts, grid, p.constexprs, p.num_warps)
    return out


def _graph_device(example_inputs, graph: LoopGraph) -> torch.device:
    """Where the wrapper allocates (`devices.accelerator_of`); CPU tensors alone run in Triton's
    interpreter; a graph without tensors runs on the GPU when there is one."""
    found = accelerator_of(list(example_inputs) + list(graph.constants.values()))
    if found is not None:
        return found
    if any(isinstance(t, torch.Tensor) for t in (*example_inputs, *graph.constants.values())):
        return torch.device("cpu")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
