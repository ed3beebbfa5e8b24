"""codegen/: scheduled loop IR -> runnable code. The public entry point of kiln's code generator.

    kiln.codegen.compile_graph(gm, example_inputs, *, options=None) -> callable

In: a functional ATen `torch.fx.GraphModule` (what `make_fx` or kiln's AOT autograd gives;
call nodes target `torch.ops.aten` overloads, placeholders are tensors, the output is a
tuple/list of tensors) and example inputs. Out: a callable taking the flat inputs positionally
and returning the outputs as a tuple — usable as `fw_compiler`/`bw_compiler`. The pipeline is
`lower_graph` -> `schedule` -> `render_module` (C++) + `render_wrapper` (Python) -> `build`.

A graph the C++ path cannot take (inputs not on the CPU, symbolic sizes) or a machine without
a C++ compiler gives back the graph module itself (eager ATen kernels), with the reason logged
under `KILN_LOGS=perf_hints` (and, for a missing compiler, a one-time warning with the fix).

Files: cpp/ops.py (C++ tables and prelude), cpp/renderer.py (kernels), wrapper.py (the Python
program), compiled.py (`CompiledGraph`, what the callable is).
"""

from __future__ import annotations

import time

import torch

from .. import logs, trace
from ..lower import GraphUnsupported, extern_summary, lower_graph
from ..options import Options
from ..runtime.cpp_builder import CompilerNotFound, build
from ..schedule import schedule
from .compiled import CompiledGraph, make_namespace
from .cpp.renderer import render_module
from .devices import eager_callable
from .restride import functionalize_restrides
from .wrapper import OUT_VARIANTS, checked_input_names, render_wrapper


def compile_graph(gm: torch.fx.GraphModule, example_inputs, *, options: Options | None = None):
    """Compile an ATen graph to C++/OpenMP kernels plus a Python wrapper (see module doc)."""
    from . import devices  # graphs on another device (CUDA: Triton) go to its code generator

    if devices.device_type(example_inputs, gm) != "cpu":
        return devices.compile_graph(gm, example_inputs, options=options)
    try:
        return compile_graph_strict(gm, example_inputs, options=options)
    except GraphUnsupported as e:
        logs.log("perf_hints", f"graph runs eagerly: {e}")
    except CompilerNotFound as e:
        logs.warn_once("kiln-no-compiler", f"{e} Running graphs eagerly.")
    return eager_callable(gm)


def compile_graph_strict(gm, example_inputs, *, options: Options | None = None) -> CompiledGraph:
    """`compile_graph` without the eager fallback: errors propagate (tests use this)."""
    start = time.perf_counter()
    functionalize_restrides(gm)
    fuel = options.get("debug.fuel") if options is not None else None
    verify_ir = options.get("debug.verify_ir") if options is not None else False
    graph = lower_graph(gm, list(example_inputs))
    sched = schedule(
        graph, fuel=fuel, verify_ir=verify_ir, out_externs=frozenset(OUT_VARIANTS), arena=True
    )
    module = render_module(sched)
    params = {k.name: k.params for k in module.kernels}
    wrapper = render_wrapper(sched, params, checked_input_names(gm, graph.inputs))
    trace.kernels("cpu", module.kernels, wrapper.source)
    logs.log(
        "output_code",
        lambda: f"C++ kernels:\n{module.source}\nwrapper:\n{wrapper.source}",
    )
    summary = extern_summary(sched.graph)
    if summary:
        logs.log("perf_hints", f"extern calls in this graph: {summary}")
    lib = (
        build(module.source, {k.name: len(k.params) for k in module.kernels})
        if (module.kernels)
        else None
    )
    namespace = make_namespace(lib, module, wrapper, graph.constants)
    exec(compile(wrapper.source, "<kiln wrapper>", "exec"), namespace)
    compiled = CompiledGraph(
        namespace["call"], sched, module.source, wrapper.source, time.perf_counter() - start
    )
    return compiled


__all__ = ["CompiledGraph", "compile_graph", "compile_graph_strict"]
