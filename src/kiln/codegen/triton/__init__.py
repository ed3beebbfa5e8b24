"""codegen/triton/: the renderer of the cuda device — scheduled loop IR -> Triton kernels.

    kiln.codegen.triton.compile_graph(gm, example_inputs, *, options=None) -> callable

The same contract as `kiln.codegen.compile_graph` (the C++ path): a functional ATen graph and
example inputs in, a callable taking the flat inputs and returning a tuple of outputs out. The
pipeline is `lower_graph` -> `schedule` (both shared with the C++ path) -> `render_module`
(Triton) + `render_wrapper` (Python) -> `triton_builder.load`. Inputs may be CUDA tensors (the
GPU) or CPU tensors (Triton's interpreter, `TRITON_INTERPRET=1`, which the tests use); buffers
are allocated on the inputs' device. A graph the path cannot take, or a machine without
Triton, gives back the graph module itself with the reason logged (`KILN_LOGS=perf_hints`).

Files: ops.py (Triton tables and helper prelude), indexing.py (block index expressions),
heuristics.py (kernel kinds, block sizes, warps), renderer.py (kernels), wrapper.py (the
Python program). The builder is runtime/triton_builder.py.
"""

from __future__ import annotations

import contextlib
import time

import torch

from ... import logs, trace
from ...lower import GraphUnsupported, extern_summary, lower_graph
from ...lower.conv_layout import channels_last_convolutions
from ...lower.graph import ensure_meta
from ...lower.ir import LoopGraph
from ...lower.layouts import empty_with_layout
from ...options import Options
from ...runtime import native
from ...runtime.triton_builder import (
    TritonNotFound,
    compiling,
    finish_compiles,
    load,
    prestart,
    require_triton,
)
from ...runtime.triton_interpret import is_interpreting
from ...runtime.triton_launch import FastKernel
from ...schedule import schedule
from ..bias_add import unfuse_bias_adds
from ..bindings import fast_externs
from ..compiled import CompiledGraph
from ..devices import eager_callable
from ..embedding_grad import scatter_embedding_grads
from ..pad_mm import pad_matmuls
from ..restride import functionalize_restrides
from ..wrapper import checked_input_names
from .renderer import TritonKernel, TritonModule, render_module
from .wrapper import render_wrapper


class TritonCompiledGraph(CompiledGraph):
    """A compiled graph whose kernels are Triton (`.triton_source`, `.wrapper_source`)."""

    @property
    def triton_source(self) -> str:
        return self.cpp_source  # CompiledGraph's field for the kernel source

    def __repr__(self) -> str:
        return super().__repr__().replace("CompiledGraph", "CompiledGraph (Triton)")


def compile_graph(gm: torch.fx.GraphModule, example_inputs, *, options: Options | None = None):
    """Compile an ATen graph to Triton kernels plus a Python wrapper (see module doc)."""
    try:
        return compile_graph_strict(gm, example_inputs, options=options)
    except GraphUnsupported as e:
        logs.log("perf_hints", f"graph runs eagerly: {e}")
    except TritonNotFound as e:
        logs.warn_once("kiln-no-triton", f"{e} Running graphs eagerly.")
    return eager_callable(gm)


def compile_graph_strict(
    gm, example_inputs, *, options: Options | None = None
) -> TritonCompiledGraph:
    """`compile_graph` without the eager fallback: errors propagate (tests use this)."""
    require_triton()
    start = time.perf_counter()
    prestart()
    rewrite_graph(gm, example_inputs, options)
    fuel = options.get("debug.fuel") if options is not None else None
    verify_ir = options.get("debug.verify_ir") if options is not None else False
    example_inputs = list(example_inputs)
    graph = _lower_on_any_device(gm, example_inputs)
    sched = schedule(graph, fuel=fuel, verify_ir=verify_ir)
    emulate = options.get("triton.emulate_precision_casts") if options is not None else False
    module = render_module(sched, emulate_casts=emulate, interpret=is_interpreting())
    kernels = {k.name: k for k in module.kernels}
    wrapper = render_wrapper(sched, kernels, checked_input_names(gm, graph.inputs))
    trace.kernels("triton", module.kernels, wrapper.source)
    logs.log("output_code", lambda: f"Triton kernels:\n{module.source}\nwrapper:\n{wrapper.source}")
    summary = extern_summary(sched.graph)
    if summary:
        logs.log("perf_hints", f"extern calls in this graph: {summary}")
    launches = _launches(module, sched.graph)
    loaded = load(module.source, launches, wait=False) if module.kernels else None
    device = _graph_device(example_inputs, graph)
    namespace = make_namespace(loaded, module, wrapper, graph.constants, device)
    exec(compile(wrapper.source, "<kiln triton wrapper>", "exec"), namespace)
    seconds = time.perf_counter() - start
    compiled = TritonCompiledGraph(namespace["call"], sched, module.source, wrapper.source, seconds)
    if loaded is not None and compiling(loaded):
        compiled._fn = _first_waits(compiled, loaded, namespace["call"])
    return compiled


def rewrite_graph(gm: torch.fx.GraphModule, example_inputs, options: Options | None = None) -> None:
    """The ATen-level rewrites made before lowering, in place (benchmarks/triton_passes_cpu.py
    times them too): restrides made functional, `val` metadata, bias adds apart from their
    matmuls, embedding gradients scattered or padded, matmuls padded to aligned sizes (unless
    `shape_padding` is off)."""
    functionalize_restrides(gm)
    ensure_meta(gm, example_inputs)
    unfuse_bias_adds(gm)
    scatter_embedding_grads(gm)
    if options is None or options.get("shape_padding"):
        pad_matmuls(gm, example_inputs)


def _first_waits(compiled: TritonCompiledGraph, loaded, call):
    """The wrapper's `call`, whose first run waits for the workers compiling `loaded`'s kernels
    (they compile while the next graph — a training step's forward, compiled after its
    backward — is lowered)."""

    def first(args):
        finish_compiles(loaded)
        compiled._fn = call
        return call(args)

    return first


# -- the wrapper's namespace -----------------------------------------------------------------


def _empty(size, stride, dtype, device):
    return torch.empty_strided(size, stride, dtype=dtype, device=device)


def _fix_input(t: torch.Tensor, name: str, size, stride, device=None) -> torch.Tensor:
    """An input with other strides (or on another device) is copied into the compiled ones."""
    if tuple(t.shape) != tuple(size):
        raise RuntimeError(
            f"kiln: input {name} has shape {tuple(t.shape)}, but this graph was compiled for "
            f"{tuple(size)}; recompile for the new shape."
        )
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=device or t.device)
    out.copy_(t)
    return out


def _device_guard(device: torch.device):
    if device.type == "cuda" and device.index is not None:
        if device.index != torch.cuda.current_device():
            return torch.cuda.device(device.index)
    return contextlib.nullcontext()


def make_namespace(loaded, module: TritonModule, wrapper, constants: dict, device) -> dict:
    ns: dict = {
        "torch": torch,
        "_empty": _empty,
        "_as_strided": native.as_strided(),
        "_fix_input": _fix_input,
        "_device_guard": _device_guard,
        "_default_device": device,
        # an int compare per input instead of building a torch.device (-1: the CPU)
        "_device_index": torch.empty(0, device=device).get_device(),
    }
    fast = not is_interpreting()  # the interpreter has no compiled launchers to call
    for k in module.kernels:
        jit = getattr(loaded, k.name)
        ns[k.name] = FastKernel(jit) if fast else jit
    ns.update(fast_externs(wrapper.externs))
    ns.update(constants)
    return ns


def _launches(module: TritonModule, graph: LoopGraph) -> dict:
    nodes = graph.node_map()

    def dtype(name):
        n = nodes[name]
        return n.dtype if hasattr(n, "dtype") else n.layout.dtype

    # split reductions' scratch buffers (split.py), read by their `_sum` kernels too
    scratch = {name: dt for k in module.kernels for name, _, dt in k.workspaces}
    out, seen = {}, set()
    for k in module.kernels:
        k: TritonKernel
        dts = [scratch[p] if p in scratch else dtype(p) for p in k.params]
        p = k.plan
        # a kernel with the code of an earlier one compiles to the same binary when launched
        # with the same argument types and options: that binary is compiled once
        variant = (module.same_as.get(k.name, k.name), tuple(dts), repr(p.constexprs), p.num_warps)
        if variant not in seen:
            seen.add(variant)
            out[k.name] = (dts, p.grid, p.constexprs, p.num_warps)
    return out


# -- lowering graphs whose tensors are not on the CPU -----------------------------------------


def _graph_device(example_inputs, graph: LoopGraph) -> torch.device:
    tensors = [t for t in list(example_inputs) + list(graph.constants.values())]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    for t in sorted(tensors, key=lambda t: t.device.type == "cpu"):
        return t.device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _standin(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor with `t`'s layout (lower/ reads layouts only; untouched pages cost nothing)."""
    return t if t.device.type == "cpu" else empty_with_layout(t, "cpu")


class _StandinModule:
    """What `lower_graph` reads of a graph module, with device tensors replaced by stand-ins."""

    def __init__(self, gm: torch.fx.GraphModule, real: dict) -> None:
        self.graph, self._gm, self._real = gm.graph, gm, real

    def __getattr__(self, name: str):
        value = getattr(self._gm, name)
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            stand = _standin(value)
            self._real[id(stand)] = (stand, value)
            return stand
        return value


def _lower_on_any_device(gm, example_inputs) -> LoopGraph:
    """`lower_graph`, which takes CPU tensors, for a graph on any device.

    lower/ refuses non-CPU placeholders and attributes (it was written with the C++ path); it
    only reads their layouts, so it gets CPU stand-ins of the same layouts, after the graph's
    metadata (`val`, which fixes extern output layouts) has been computed on the real device.
    """
    on_device = any(
        isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in example_inputs
    ) or any(
        isinstance(getattr(gm, n.target, None), torch.Tensor)
        and getattr(gm, n.target).device.type != "cpu"
        for n in gm.graph.nodes
        if n.op == "get_attr"
    )
    if not on_device:
        return lower_graph(gm, example_inputs, indirect_loads=False)  # Triton prints none
    ensure_meta(gm, example_inputs)  # on the real device, before the stand-ins
    channels_last_convolutions(gm, example_inputs)  # lower_graph would do it on the stand-ins
    real: dict = {}
    inputs = [_standin(t) if isinstance(t, torch.Tensor) else t for t in example_inputs]
    graph = lower_graph(_StandinModule(gm, real), inputs, indirect_loads=False)
    constants = {
        name: real[id(t)][1] if id(t) in real and real[id(t)][0] is t else t
        for name, t in graph.constants.items()
    }
    return LoopGraph(graph.nodes, graph.inputs, graph.outputs, constants)


__all__ = ["TritonCompiledGraph", "compile_graph", "compile_graph_strict", "render_module"]
