"""kiln's built-in backends: `eager`, `aot_eager`, `inductor` and `cudagraphs`.

`eager` runs the captured torch-level graph as it is. `aot_eager` traces it to ATen with
kiln's ahead-of-time autograd and runs eager ATen kernels. `inductor` (the default) is kiln's
code generator: AOT autograd gives functional ATen forward and backward graphs (or one
inference graph), and `kiln.codegen.compile_graph` turns each into C++/OpenMP kernels and a
Python wrapper. A graph the code generator cannot compile runs on eager ATen kernels, and a
captured graph AOT autograd refuses runs on the `eager` backend; both say why under
`KILN_LOGS=perf_hints`. Falling back is always correct; it is never a wrong answer.
`cudagraphs` is `aot_eager` with each compiled graph replayed as a device graph
(runtime/device_graphs.py); `inductor` does the same under `options={"triton.cudagraphs": True}`
or `mode="reduce-overhead"`.
"""

from __future__ import annotations

from typing import Callable

import torch

from .. import logs
from .registry import register_backend, register_lazy


@register_backend(name="eager")
def eager(gm: torch.fx.GraphModule, example_inputs: list):
    return gm.forward


def _graph_compiler(options) -> Callable:
    """`compile_graph` for one ATen graph, or eager ATen kernels (logged) if it fails."""
    from ..codegen import compile_graph

    def compile_one(aten_gm: torch.fx.GraphModule, inputs: list):
        try:
            return compile_graph(aten_gm, inputs, options=options)
        except Exception as e:  # a codegen bug must cost speed, not correctness
            logs.log(
                "perf_hints",
                f"inductor: code generation failed ({type(e).__name__}: {e}); this graph runs "
                "on eager ATen kernels",
            )
            return _eager_aten(aten_gm)

    return compile_one


def _eager_aten(gm: torch.fx.GraphModule) -> Callable:
    def run(*args):
        out = gm(*args)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)

    return run


@register_backend(name="inductor")
def inductor(gm: torch.fx.GraphModule, example_inputs: list):
    """AOT autograd with kiln's C++ code generator compiling the forward and backward graphs.

    The frozen `Options` of the `kiln.compile` call reach the code generator when capture
    records them in `gm.meta["kiln_options"]`; otherwise the defaults apply.
    """
    from ..autograd import aot_compile

    options = gm.meta.get("kiln_options") if hasattr(gm, "meta") else None
    compiler = _graph_compiler(options)
    try:
        if options is not None and options.get("triton.cudagraphs"):
            from ..runtime.device_graphs import wrap_compilers

            compilers = wrap_compilers(compiler, compiler, _device_graph_group(gm))
            return aot_compile(gm, example_inputs, **compilers)
        return aot_compile(gm, example_inputs, fw_compiler=compiler, bw_compiler=compiler)
    except Exception as e:  # AotUnsupported and anything unforeseen: run the captured graph
        logs.log(
            "perf_hints",
            f"inductor: AOT autograd could not take this graph ({type(e).__name__}: {e}); "
            "it runs on the 'eager' backend",
        )
        return eager(gm, example_inputs)


register_lazy("aot_eager", "kiln.autograd.backend:aot_eager")
register_lazy(
    "aot_eager_decomp_partition", "kiln.autograd.backend:aot_eager_decomp_partition", ("debug",)
)
register_lazy("aot_eager_save_all", "kiln.autograd.backend:aot_eager_save_all", ("debug",))


def _device_graph_group(gm: torch.fx.GraphModule):
    from ..runtime.device_graphs import GraphGroup

    meta = getattr(gm, "meta", {})
    label = meta.get("kiln_label", "a compiled graph")
    # capture's positions among all inputs -> positions among the tensors AOT graphs take
    held = set(meta.get("kiln_static_inputs", ()))
    tensors = [i for i, n in enumerate(gm.graph.find_nodes(op="placeholder")) if _is_tensor(n)]
    static = [k for k, i in enumerate(tensors) if i in held]
    return GraphGroup(label=str(label), static_inputs=static)


def _is_tensor(placeholder: torch.fx.Node) -> bool:
    return isinstance(placeholder.meta.get("example_value"), torch.Tensor)


@register_backend(name="cudagraphs")
def cudagraphs(gm: torch.fx.GraphModule, example_inputs: list):
    """AOT autograd on eager ATen kernels, forward and backward replayed as device graphs."""
    from ..autograd import aot_compile
    from ..autograd.backend import eager_graph
    from ..runtime.device_graphs import wrap_compilers

    compilers = wrap_compilers(eager_graph, eager_graph, _device_graph_group(gm))
    try:
        return aot_compile(gm, example_inputs, decompositions={}, **compilers)
    except Exception as e:  # AotUnsupported and anything unforeseen: run the captured graph
        logs.log(
            "perf_hints",
            f"cudagraphs: AOT autograd could not take this graph ({type(e).__name__}: {e}); "
            "it runs on the 'eager' backend without device graphs",
        )
        return eager(gm, example_inputs)
