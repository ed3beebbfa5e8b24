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

import contextlib

import torch

from ... import native
from ...devices import accelerator_of
from ...lower.ir import LoopGraph
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
from ..bindings import fast_externs
from ..compiled import FirstCall
from .renderer import TritonKernel, TritonModule, render_module
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

    def build(self, kernels: TritonModule, wrapper, sched, example_inputs):
        graph = sched.graph
        launches = _launches(kernels, graph)
        loaded = load(kernels.source, launches, wait=False) if kernels.kernels else None
        device = _graph_device(example_inputs, graph)
        namespace = _namespace(loaded, kernels, wrapper, graph.constants, device)
        exec(compile(wrapper.source, "<kiln triton wrapper>", "exec"), namespace)
        call = namespace["call"]
        if loaded is not None and compiling(loaded):
            # the workers compile while the next graph (a training step's forward, compiled
            # after its backward) is lowered; the first call waits for them
            return FirstCall(lambda: finish_compiles(loaded), call)
        return call


TRITON = TritonCodeGen()


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


def _namespace(loaded, module: TritonModule, wrapper, constants: dict, device) -> dict:
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


def _graph_device(example_inputs, graph: LoopGraph) -> torch.device:
    """Where the wrapper allocates (`devices.accelerator_of`); CPU tensors alone run in Triton's
    interpreter; a graph without tensors runs on the GPU when there is one."""
    found = accelerator_of(list(example_inputs) + list(graph.constants.values()))
    if found is not None:
        return found
    if any(isinstance(t, torch.Tensor) for t in (*example_inputs, *graph.constants.values())):
        return torch.device("cpu")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
