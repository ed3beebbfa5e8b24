"""The cpu device's code generator: C++/OpenMP kernels in one translation unit per graph.

Takes a `Schedule` (render), the kernels and the schedule (wrap) and the rendered module
(build); gives the C++ source, the Python wrapper program and, built with the system compiler
(runtime/cpp_builder.py, cached by content), the wrapper's `call`. The device itself (its
rewrites and capabilities) is described in devices/builtin.py.

Why it exists: the pipeline (codegen/pipeline.py) is the same for every device; this is the
small part that is the CPU's.
"""

from __future__ import annotations

import torch

from ... import native
from ...runtime.cpp_builder import CompilerNotFound, build, find_compiler
from ...schedule.arena import new_block
from ..bindings import fast_externs
from ..wrapper import WrapperProgram, render_wrapper
from .renderer import CppModule, render_module


def _empty(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


def _fix_input(t: torch.Tensor, name: str, size, stride) -> torch.Tensor:
    """An input whose strides differ from the compiled ones is copied into those strides."""
    if tuple(t.shape) != tuple(size):
        raise RuntimeError(
            f"kiln: input {name} has shape {tuple(t.shape)}, but this graph was compiled for "
            f"{tuple(size)}; recompile for the new shape."
        )
    if t.device.type != "cpu":
        raise RuntimeError(f"kiln: input {name} is on {t.device}; this graph runs on the CPU")
    out = torch.empty_strided(size, stride, dtype=t.dtype, device="cpu")
    out.copy_(t)
    return out


class CppCodeGen:
    """The cpu device's render, wrap and build passes (devices.CodeGen)."""

    kernel_language = "C++"

    def unavailable(self) -> str | None:
        try:
            find_compiler()
        except CompilerNotFound as e:
            return str(e)
        return None

    def start(self, options) -> None:
        pass  # one compiler run per graph: nothing to start early

    def render(self, sched, options) -> CppModule:
        return render_module(sched)

    def wrap(self, sched, kernels: CppModule, checked_inputs, capabilities) -> WrapperProgram:
        params = {k.name: k.params for k in kernels.kernels}
        return render_wrapper(sched, params, checked_inputs, capabilities.out_variants)

    def build(self, kernels: CppModule, wrapper: WrapperProgram, sched, example_inputs):
        names = {k.name: len(k.params) for k in kernels.kernels}
        lib = build(kernels.source, names) if names else None
        ns: dict = {
            "torch": torch,
            "_empty": _empty,
            "_as_strided": native.as_strided(),
            "_fix_input": _fix_input,
            "_new_arena": new_block,
            "_arenas": [],  # this graph's arenas between calls (schedule/arena.py)
        }
        for k in kernels.kernels:
            ns[k.name] = getattr(lib, k.name)
        ns.update(fast_externs(wrapper.externs))
        ns.update(sched.graph.constants)
        exec(compile(wrapper.source, "<kiln wrapper>", "exec"), ns)
        return ns["call"]


CPP = CppCodeGen()
