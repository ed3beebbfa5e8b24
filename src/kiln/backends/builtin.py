"""kiln's built-in backends: `eager`, `aot_eager`, `inductor` and `cudagraphs`.

`eager` runs the captured torch-level graph as it is. `aot_eager` traces it to ATen with
kiln's ahead-of-time autograd and runs eager ATen kernels. `inductor` (the default) is kiln's
code generator: AOT autograd gives functional ATen forward and backward graphs (or one
inference graph), and `kiln.codegen.compile_graph` turns each into C++/OpenMP kernels and a
Python wrapper. `cudagraphs` is `aot_eager` with each compiled graph replayed as a device graph
(runtime/device_graphs.py); `inductor` does the same under `options={"triton.cudagraphs": True}`
or `mode="reduce-overhead"`.

Fallbacks. An ATen graph the code generator cannot compile (it raises, or gives the graph back)
runs on eager ATen kernels, and a captured graph AOT autograd refuses runs on the `eager`
backend. Falling back is always correct, never a wrong answer, but it is not kiln's code
running: each one is logged under `KILN_LOGS=perf_hints` and kept in a process-wide record
(`fallbacks()`: which graph, which stage, why), so that `kiln bench` can count a row's
fallbacks instead of reporting eager kernels under kiln's name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from .. import logs
from .registry import register_backend, register_lazy


@dataclass(frozen=True)
class Fallback:
    """One graph that did not run on the backend's own compiled code."""

    graph: str  # the captured graph's label (the function or module it came from)
    stage: str  # "code generation" or "AOT autograd": the stage that gave up
    reason: str

    def __str__(self) -> str:
        return f"{self.graph}: {self.stage}: {self.reason}"


_record: list[Fallback] = []


def fallbacks() -> list[Fallback]:
    """Every fallback of this process so far, oldest first (read a run's as a slice of it)."""
    return list(_record)


def _fell_back(gm: torch.fx.GraphModule, stage: str, reason: str, message: str | None) -> None:
    """Record a fallback of captured graph `gm`, and log `message` (None: already logged)."""
    label = getattr(gm, "meta", {}).get("kiln_label", "a graph")
    _record.append(Fallback(str(label), stage, reason))
    if message is not None:
        logs.log("perf_hints", message)


@register_backend(name="eager")
def eager(gm: torch.fx.GraphModule, example_inputs: list):
    return gm.forward


def _graph_compiler(options, captured: torch.fx.GraphModule, checked=()) -> Callable:
    """`compile_graph` for one ATen graph of `captured`, or eager ATen kernels if it fails.
    `checked`: positions of the graph's inputs whose layouts capture's guards check on every
    call (a forward's inputs are the captured tensors); the wrapper does not check them again
    (`aten_gm.meta["kiln_checked_inputs"]`)."""
    from ..codegen import compile_graph
    from ..codegen.devices import eager_callable

    given_back = eager_callable(captured).__code__  # what a code generator returns to decline

    def compile_one(aten_gm: torch.fx.GraphModule, inputs: list):
        said = _Said()  # the code generator logs why when it gives a graph back
        hints = logging.getLogger("kiln.perf_hints")
        hints.addHandler(said)
        if checked:
            aten_gm.meta["kiln_checked_inputs"] = tuple(checked)
        try:
            compiled = compile_graph(aten_gm, inputs, options=options)
        except Exception as e:  # a codegen bug must cost speed, not correctness
            reason = f"{type(e).__name__}: {e}"
            _fell_back(
                captured,
                "code generation",
                reason,
                f"inductor: code generation failed ({reason}); this graph runs on eager ATen "
                "kernels",
            )
            return eager_callable(aten_gm)
        finally:
            hints.removeHandler(said)
        if getattr(compiled, "__code__", None) is given_back:  # declined, and logged why
            _fell_back(captured, "code generation", said.why, None)
        return compiled

    return compile_one


class _Said(logging.Handler):
    """Keeps the code generator's "graph runs eagerly: why" line (logged when perf_hints is on)."""

    def __init__(self) -> None:
        super().__init__()
        self.why = "declined (KILN_LOGS=perf_hints says why)"

    def emit(self, record: logging.LogRecord) -> None:
        head, _, why = record.getMessage().partition("graph runs eagerly: ")
        if not head and why:
            self.why = f"declined: {why}"


def _aot_or_eager(backend: str, gm: torch.fx.GraphModule, example_inputs: list, **compilers):
    """`aot_compile(gm, example_inputs, **compilers)`, or, when AOT autograd refuses the graph
    (AotUnsupported, or anything unforeseen), the captured graph on the `eager` backend."""
    from ..autograd import aot_compile

    try:
        return aot_compile(gm, example_inputs, **compilers)
    except Exception as e:
        reason = f"{type(e).__name__}: {e}"
        without = " without device graphs" if backend == "cudagraphs" else ""
        _fell_back(
            gm,
            "AOT autograd",
            reason,
            f"{backend}: AOT autograd could not take this graph ({reason}); it runs on the "
            f"'eager' backend{without}",
        )
        return eager(gm, example_inputs)


@register_backend(name="inductor")
def inductor(gm: torch.fx.GraphModule, example_inputs: list):
    """AOT autograd with kiln's C++ code generator compiling the forward and backward graphs.

    The frozen `Options` of the `kiln.compile` call reach the code generator when capture
    records them in `gm.meta["kiln_options"]`; otherwise the defaults apply.
    """
    options = gm.meta.get("kiln_options") if hasattr(gm, "meta") else None
    compiler = _graph_compiler(options, gm)
    # a forward (or inference) graph takes the captured tensors as they are
    forward = _graph_compiler(options, gm, _tensor_positions(gm, "kiln_checked_inputs"))
    compilers = {"fw_compiler": forward, "bw_compiler": compiler}
    if options is not None and options.get("triton.cudagraphs"):
        from ..runtime.device_graphs import wrap_compilers

        # replays read static copies of the inputs: the wrapper checks those itself
        compilers = wrap_compilers(compiler, compiler, _device_graph_group(gm))
    _prestart_compile_workers(example_inputs)
    try:
        return _aot_or_eager("inductor", gm, example_inputs, **compilers)
    finally:  # the graph is compiled: idle compile workers would slow its calls
        from ..runtime.triton_builder import shutdown

        shutdown(wait=False)  # they exit (~1 s each, in parallel) while the first call runs


def _prestart_compile_workers(example_inputs: list) -> None:
    """A graph on a CUDA device will compile Triton kernels: start the compile workers now, so
    that their start-up (about a second: importing Triton, building its driver) overlaps AOT
    tracing, lowering and scheduling instead of only the last two (a small MLP's first call
    waited 0.9 s for them)."""
    if any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
        from ..runtime.triton_builder import prestart

        try:
            prestart()
        except Exception as e:  # the code generator starts them (or compiles inline) later
            logs.log("perf_hints", f"could not start the Triton compile workers early: {e!r}")


register_lazy("aot_eager", "kiln.autograd.backend:aot_eager")
register_lazy(
    "aot_eager_decomp_partition", "kiln.autograd.backend:aot_eager_decomp_partition", ("debug",)
)
register_lazy("aot_eager_save_all", "kiln.autograd.backend:aot_eager_save_all", ("debug",))


def _device_graph_group(gm: torch.fx.GraphModule):
    from ..runtime.device_graphs import GraphGroup

    label = getattr(gm, "meta", {}).get("kiln_label", "a compiled graph")
    static = _tensor_positions(gm, "kiln_static_inputs")
    return GraphGroup(label=str(label), static_inputs=static)


def _tensor_positions(gm: torch.fx.GraphModule, key: str) -> list[int]:
    """Capture's positions (`gm.meta[key]`) among all inputs, as positions among the tensor
    inputs, which the AOT graphs take."""
    chosen = set(getattr(gm, "meta", {}).get(key, ()))
    tensors = [i for i, n in enumerate(gm.graph.find_nodes(op="placeholder")) if _is_tensor(n)]
    return [k for k, i in enumerate(tensors) if i in chosen]


def _is_tensor(placeholder: torch.fx.Node) -> bool:
    return isinstance(placeholder.meta.get("example_value"), torch.Tensor)


@register_backend(name="cudagraphs")
def cudagraphs(gm: torch.fx.GraphModule, example_inputs: list):
    """AOT autograd on eager ATen kernels, forward and backward replayed as device graphs."""
    from ..autograd.backend import eager_graph
    from ..runtime.device_graphs import wrap_compilers

    compilers = wrap_compilers(eager_graph, eager_graph, _device_graph_group(gm))
    return _aot_or_eager("cudagraphs", gm, example_inputs, decompositions={}, **compilers)
