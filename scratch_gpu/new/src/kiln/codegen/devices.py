"""The device registry: which code generator compiles a graph, chosen from its inputs' device.

Takes the example inputs (and constants) of an ATen graph; gives the `compile_graph` of the
device they live on. Built in: `cpu` -> the C++/OpenMP path (`kiln.codegen.compile_graph`),
`cuda` -> the Triton path (`kiln.codegen.triton.compile_graph`). Both have the same contract,
`compile_graph(gm, example_inputs, *, options=None) -> callable`.

A device is a small plug-in (DESIGN.md §2): `register_device("npu", "my_pkg.codegen:compile")`
adds one. Entries name their compiler as `"module:function"` and are imported on first use, so
importing kiln never imports Triton, and a CPU-only machine never needs it.

The choice is made here and nowhere else (STYLE.md item 5): a graph goes to the device of its
first tensor that is not on the CPU — a CPU scalar tensor beside CUDA tensors is copied to the
GPU by the wrapper — and to the CPU when every tensor is there. A device with no registered
compiler runs the graph on eager ATen kernels, with the reason logged under
`KILN_LOGS=perf_hints`.

Why it exists: `kiln.compile` on a CUDA model and on a CPU model take the same path through
capture and autograd; only this table differs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from .. import logs


@dataclass(frozen=True)
class Device:
    type: str  # a torch device type: "cpu", "cuda", ...
    compiler: str  # "module:function", a compile_graph with the codegen contract
    description: str = ""

    def load(self) -> Callable:
        module, _, fn = self.compiler.partition(":")
        return getattr(importlib.import_module(module), fn)


DEVICES: dict[str, Device] = {}


def register_device(type: str, compiler: str, description: str = "") -> Device:
    """Register (or replace) the code generator of a torch device type."""
    if ":" not in compiler:
        raise ValueError(f"compiler must be 'module:function', got {compiler!r}")
    try:
        torch.device(type)
    except RuntimeError as e:
        raise ValueError(f"{type!r} is not a torch device type: {e}") from None
    DEVICES[type] = Device(type, compiler, description)
    return DEVICES[type]


register_device("cpu", "kiln.codegen:compile_graph", "C++/OpenMP kernels (codegen/cpp)")
register_device("cuda", "kiln.codegen.triton:compile_graph", "Triton kernels (codegen/triton)")


def _tensors(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)


def device_type(example_inputs, gm: torch.fx.GraphModule | None = None) -> str:
    """The device type a graph runs on (see module doc)."""
    tensors = list(_tensors(example_inputs))
    if gm is not None:
        attrs = (getattr(gm, n.target, None) for n in gm.graph.nodes if n.op == "get_attr")
        tensors += [t for t in attrs if isinstance(t, torch.Tensor)]
    for t in tensors:
        if t.device.type not in ("cpu", "meta"):
            return t.device.type
    return "cpu"


def compiler_for(type: str) -> Callable | None:
    entry = DEVICES.get(type)
    return entry.load() if entry is not None else None


def eager_callable(gm: torch.fx.GraphModule):
    """The graph on eager ATen kernels, with the compiled callables' flat-tuple contract: the
    fallback every code generator returns when it cannot take a graph."""

    def run(*args):
        out = gm(*args)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)

    return run


def compile_graph(gm: torch.fx.GraphModule, example_inputs, *, options=None):
    """Compile `gm` with the code generator of its inputs' device."""
    kind = device_type(example_inputs, gm)
    compiler = compiler_for(kind)
    if compiler is None:
        known = ", ".join(sorted(DEVICES))
        logs.log("perf_hints", f"graph runs eagerly: no code generator for {kind} ({known})")
        return eager_callable(gm)
    return compiler(gm, example_inputs, options=options)


__all__ = [
    "DEVICES",
    "Device",
    "compile_graph",
    "compiler_for",
    "device_type",
    "eager_callable",
    "register_device",
]
