"""The cpu device's code generator: C++/OpenMP kernels in one translation unit per graph.

Takes a `Schedule` (render), the kernels and the schedule (wrap) and the rendered module
(build); gives the C++ source, the Python wrapper program and, built with the system compiler
(runtime/cpp_builder.py, cached by content), the wrapper's `call`. The device itself (its
rewrites and capabilities) is described in devices/builtin.py.

Why it exists: the pipeline (codegen/pipeline.py) is the same for every device; this is the
small part that is the CPU's.
"""

from __future__ import annotations

from ...devices import Loadable
from ...runtime.cpp_builder import CompilerNotFound, find_compiler
from ..bindings import op_names
from ..wrapper import WrapperProgram, render_wrapper
from .load import load
from .module import render_module
from .renderer import CppModule


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
        sizes = {k.name: k.sizes for k in kernels.kernels if k.sizes}
        return render_wrapper(sched, params, checked_inputs, capabilities.out_variants, sizes)

    def loadable(self, kernels: CppModule, wrapper: WrapperProgram, sched, example_inputs):
        """The build as data (load.py loads it); None when an extern is not an ATen overload
        (such a graph is built, but not kept by the compiled-artifact cache)."""
        externs = op_names(wrapper.externs)
        return (
            None if externs is None else Loadable(LOADER, _data(kernels, wrapper, sched, externs))
        )

    def build(self, kernels: CppModule, wrapper: WrapperProgram, sched, example_inputs):
        return load(_data(kernels, wrapper, sched, dict(wrapper.externs)))


LOADER = "kiln.codegen.cpp.load:load"


def _data(kernels: CppModule, wrapper: WrapperProgram, sched, externs: dict) -> dict:
    return {
        "source": kernels.source,
        # sizes go as pointer-sized integers (int64_t on the C side): same registers, same ABI
        "kernels": {k.name: len(k.params) + len(k.sizes) for k in kernels.kernels},
        "wrapper": wrapper.source,
        "externs": externs,
        "constants": dict(sched.graph.constants),
    }


CPP = CppCodeGen()
