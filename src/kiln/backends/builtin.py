"""kiln's built-in backends: `eager`, `aot_eager`, `inductor` and `cudagraphs`.

`eager` runs the captured torch-level graph as it is. `aot_eager` traces it to ATen with
kiln's ahead-of-time autograd and runs eager ATen kernels. `inductor` (the default) is kiln's
code generator: AOT autograd gives functional ATen forward and backward graphs (or one
inference graph), and the one compile pipeline (`kiln.codegen.compile_graph`) compiles each for
its device (C++/OpenMP on the CPU, Triton on CUDA, or a registered device). `cudagraphs` is
`aot_eager` with each compiled graph replayed as a device graph (runtime/device_graphs.py);
`inductor` does the same under `options={"triton.cudagraphs": True}` or
`mode="reduce-overhead"`. Each takes capture's facts about the graph (`CaptureInfo`:
`takes_capture_info`); called as a plain torch.compile backend (interop), defaults apply.

Warm start. `inductor` hands AOT autograd the compiled-artifact cache (warm.py) as its entry
store: an entry compiled by an earlier process is loaded instead of compiled again.

Fallbacks. An ATen graph the pipeline declines (`Declined(reason)`) or fails on runs on eager
ATen kernels, and a captured graph AOT autograd refuses runs on the `eager` backend. Falling
back is always correct, never a wrong answer, but it is not kiln's code running: each one is
logged under `KILN_LOGS=perf_hints` and kept in a process-wide record (`fallbacks()`: which
graph, which stage, why) whatever logs are on, so that `kiln bench` can count a row's fallbacks
instead of reporting eager kernels under kiln's name.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from .. import logs
from ..contracts import CaptureInfo, takes_capture_info
from .registry import register_backend, register_lazy

if TYPE_CHECKING:  # imported where used: the runtime loads only when a graph needs it
    from ..runtime.device_graphs import GraphGroup


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


def _fell_back(info: CaptureInfo, stage: str, reason: str, message: str | None) -> None:
    """Record a fallback of the captured graph `info` describes; log `message` (None: the
    stage logged why itself)."""
    _record.append(Fallback(info.label, stage, reason))
    if message is not None:
        logs.log("perf_hints", message)


@register_backend(name="eager")
def eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    return gm.forward


def _graph_compiler(info: CaptureInfo, checked: Iterable[int] = (), arena: bool = True) -> Callable:
    """A graph compiler for AOT autograd: each ATen graph through the one pipeline, or on eager
    ATen kernels when the pipeline declines it or fails. `checked`: positions of the graph's
    inputs whose layouts capture's guards check on every call (a forward's inputs are the
    captured tensors); the wrapper does not check them again. A graph with symbolic sizes the
    pipeline declines is compiled per size instead (specialize.py). `arena`: whether its
    intermediates may live in an arena kept between calls (False for a training step's forward
    and backward: codegen/pipeline.py)."""

    def attempt(
        aten_gm: torch.fx.GraphModule, inputs: list, mutated_inputs: dict | None = None
    ) -> tuple[Callable | None, str]:
        # imported here: a warm start (warm.py) loads graphs without the pipeline's modules
        from ..codegen import Declined, compile_graph

        try:
            compiled = compile_graph(
                aten_gm,
                inputs,
                options=info.options,
                checked_inputs=tuple(checked),
                mutated_inputs=mutated_inputs,
                arena=arena,
            )
        except Exception as e:  # a codegen bug must cost speed, not correctness
            reason = f"{type(e).__name__}: {e}"
            logs.log("perf_hints", f"inductor: code generation failed ({reason})")
            return None, reason
        if isinstance(compiled, Declined):  # the pipeline logged why
            return None, str(compiled)
        return compiled, ""

    def compile_one(
        aten_gm: torch.fx.GraphModule, inputs: list, mutated_inputs: dict | None = None
    ) -> Callable:
        from ..codegen import eager_callable
        from .specialize import has_symbolic_placeholders, specialize_per_size

        compiled, reason = attempt(aten_gm, inputs, mutated_inputs)
        if compiled is not None:
            return compiled
        if has_symbolic_placeholders(aten_gm):
            return specialize_per_size(
                aten_gm,
                reason,
                attempt,
                lambda what: _fell_back(
                    info, "code generation per size", what, f"{info.label}: {what}"
                ),
                info.options.cache_size_limit,
                info.label,
            )
        _fell_back(
            info, "code generation", reason, "inductor: this graph runs on eager ATen kernels"
        )
        return eager_callable(aten_gm)

    # it takes `mutated_inputs` (autograd/compile.py asks for this attribute)
    compile_one.writes_inputs_in_place = True  # type: ignore[attr-defined]
    return compile_one


def _aot_or_eager(
    backend: str,
    gm: torch.fx.GraphModule,
    example_inputs: list,
    info: CaptureInfo,
    **compilers: Any,
) -> Callable:
    """`aot_compile(gm, example_inputs, **compilers)`, or, when AOT autograd refuses the graph
    (AotUnsupported, or anything unforeseen), the captured graph on the `eager` backend."""
    from ..autograd import aot_compile

    try:
        return aot_compile(gm, example_inputs, fixed_call_key=info.fixed_call_key, **compilers)
    except Exception as e:
        reason = f"{type(e).__name__}: {e}"
        without = " without device graphs" if backend == "cudagraphs" else ""
        _fell_back(
            info,
            "AOT autograd",
            reason,
            f"{backend}: AOT autograd could not take this graph ({reason}); it runs on the "
            f"'eager' backend{without}",
        )
        return eager(gm, example_inputs)


@register_backend(name="inductor")
@takes_capture_info
def inductor(
    gm: torch.fx.GraphModule, example_inputs: list, info: CaptureInfo | None = None
) -> Callable:
    """AOT autograd with kiln's code generator compiling the forward and backward graphs;
    under `compile.async`, in a background thread while calls run eagerly
    (runtime/async_compile.py)."""
    info = info if info is not None else CaptureInfo()
    from ..runtime import async_compile

    if info.options.get("compile.async"):
        eager_fn = async_compile.eager_copy(gm)  # before AOT autograd rewrites `gm`
        return async_compile.start(
            info.label,
            eager_fn,
            lambda: _inductor(gm, example_inputs, info),
            lambda reason: _fell_back(
                info,
                "async compile",
                reason,
                f"inductor: the background compile failed ({reason}); this graph runs eagerly",
            ),
        )
    with async_compile.compile_lock:  # one compiling thread at a time (async_compile.py)
        return _inductor(gm, example_inputs, info)


def _inductor(gm: torch.fx.GraphModule, example_inputs: list, info: CaptureInfo) -> Callable:
    # A training step's forward and backward keep no arena between calls: a block kept by
    # one would stay allocated through the other's peak (the forward's saved activations, the
    # backward's gradients) and raise the step's peak by its size (CPU GPT-2 2x128: 24.5 MiB
    # above torch.compile's 154.9, the backward's arena held through the forward).
    compiler = _graph_compiler(info, arena=False)
    # a forward (or inference) graph takes the captured tensors as they are
    checked = _tensor_positions(gm, info.checked_inputs)
    compilers: dict[str, Any] = {
        "fw_compiler": _graph_compiler(info, checked, arena=False),
        "bw_compiler": compiler,
        "inference_compiler": _graph_compiler(info, checked),
    }
    if info.options.get("triton.cudagraphs"):
        from ..runtime.device_graphs import wrap_compilers

        # replays read static copies of the inputs: the wrapper checks those itself
        plain = _graph_compiler(info)  # (device graphs: GPUs, where no arena is planned)
        compilers = wrap_compilers(plain, plain, _device_graph_group(gm, info))
    else:  # compiled entries are kept for later processes (warm.py)
        from .warm import entry_store

        compilers["entry_store"] = entry_store(info, checked)
    # when the graph is compiled, not when the artifact cache has it (a warm start)
    compilers["on_compile"] = lambda: _prestart_compile_workers(example_inputs)
    try:
        return _aot_or_eager("inductor", gm, example_inputs, info, **compilers)
    finally:  # the graph is compiled: idle compile workers would slow its calls
        _stop_compile_workers()


def _stop_compile_workers() -> None:
    """Stop the Triton compile workers; they exit (~1 s each, in parallel) while the first call
    runs. Where the pool's module was never imported no worker was started, and importing the
    Triton builder (with the pool's modules) would cost a CPU graph's warm start ~20 ms."""
    if "kiln.runtime.triton_workers" in sys.modules:
        from ..runtime.triton_builder import shutdown

        shutdown(wait=False)


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


def _device_graph_group(gm: torch.fx.GraphModule, info: CaptureInfo) -> GraphGroup:
    from ..runtime.device_graphs import GraphGroup

    static = _tensor_positions(gm, info.static_inputs)
    return GraphGroup(label=info.label, static_inputs=static)


def _tensor_positions(gm: torch.fx.GraphModule, positions: Iterable[int]) -> list[int]:
    """Capture's `positions` among all inputs, as positions among the tensor inputs, which the
    AOT graphs take."""
    chosen = set(positions)
    tensors = [i for i, n in enumerate(gm.graph.find_nodes(op="placeholder")) if _is_tensor(n)]
    return [k for k, i in enumerate(tensors) if i in chosen]


def _is_tensor(placeholder: torch.fx.Node) -> bool:
    return isinstance(placeholder.meta.get("example_value"), torch.Tensor)


@register_backend(name="cudagraphs")
@takes_capture_info
def cudagraphs(
    gm: torch.fx.GraphModule, example_inputs: list, info: CaptureInfo | None = None
) -> Callable:
    """AOT autograd on eager ATen kernels, forward and backward replayed as device graphs."""
    from ..autograd.backend import eager_graph
    from ..runtime.device_graphs import wrap_compilers

    info = info if info is not None else CaptureInfo()
    compilers = wrap_compilers(eager_graph, eager_graph, _device_graph_group(gm, info))
    return _aot_or_eager("cudagraphs", gm, example_inputs, info, decompositions={}, **compilers)
