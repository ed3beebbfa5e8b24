"""The one compile pipeline, for every device: ATen graph -> a compiled callable, or a reason.

    compile_graph(gm, example_inputs, device=None, options=None, *, checked_inputs=(),
                  mutated_inputs=None, arena=True) -> CompiledGraph | Declined

In: a functional ATen `torch.fx.GraphModule` (what `make_fx` or kiln's AOT autograd gives;
placeholders are tensors, the output a tuple/list of tensors), example inputs, the device that
compiles it (a `kiln.devices.Device`, its name, or None: the one registered for the inputs'
device type, or `options["codegen.device"]`), the frozen `Options`, and `checked_inputs`: the
positions of inputs whose layouts capture's guards check already (the wrapper does not check
them again), and `mutated_inputs`: {output position: input position} for outputs the caller
copies into an input after the call, which kernels may write into that input itself and return
it (schedule/inplace.py), and `arena`: False when the graph is one of a training step's pair
(a forward that saves for a backward, or that backward), whose intermediates then get no arena
kept between calls (schedule/arena.py; the block would stay allocated beside the other graph's
peak). Out: a `CompiledGraph` (a callable taking the flat inputs, boxed or
not, and returning a tuple) or `Declined(reason)` when the graph or the machine cannot be
compiled for — the caller then runs the graph on eager kernels and says why.

The passes, the same sequence whatever the device (`PASSES`; `KILN_LOGS=passes` prints the IR
after each):

    rewrites  the device's named ATen rewrites (kiln/rewrites)
    lower     ATen graph -> loop IR, by the device's capabilities (lower/)
    schedule  fusion, buffer reuse, memory plan (schedule/)
    render    loop IR -> kernel source (the device's code generator)
    wrap      the Python wrapper program that allocates and calls kernels and ATen ops
    build     kernels compiled and loaded, the wrapper's `call` made (a device whose code
              generator has `loadable` builds by loading that data, which the
              compiled-artifact cache also keeps: backends/warm.py)

Why it exists: one pipeline with devices as values; a change to any pass is made once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from .. import logs, trace
from ..devices import DEVICES, Device, device_for, tensor_device_type
from ..lower import GraphUnsupported, extern_summary, lower_graph
from ..lower.ir import LoopGraph
from ..options import Options
from ..rewrites import run_rewrites
from ..schedule import schedule
from .compiled import CompiledGraph

PASSES = ("rewrites", "lower", "schedule", "render", "wrap", "build")


@dataclass(frozen=True)
class Declined:
    """A graph the pipeline did not compile, and why (the caller runs it on eager kernels)."""

    reason: str
    device: str = ""  # the device it was meant for ("" when there was none)

    def __str__(self) -> str:
        where = f" for {self.device}" if self.device else ""
        return f"declined{where}: {self.reason}"


class DeviceUnavailable(RuntimeError):
    """This machine cannot build for the device (a compiler or package is missing)."""


def compile_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[object],
    device: Device | str | None = None,
    options: Options | None = None,
    *,
    checked_inputs: Iterable[int] = (),
    mutated_inputs: Mapping[int, int] | None = None,
    arena: bool = True,
) -> CompiledGraph | Declined:
    """Compile `gm` for `device` (module doc). Errors other than a refusal propagate."""
    try:
        dev = _resolve(gm, example_inputs, device, options)
    except GraphUnsupported as e:
        return _declined(Declined(str(e)))
    try:
        return compile_graph_strict(
            gm,
            example_inputs,
            dev,
            options,
            checked_inputs=checked_inputs,
            mutated_inputs=mutated_inputs,
            arena=arena,
        )
    except GraphUnsupported as e:
        return _declined(Declined(str(e), dev.name))
    except DeviceUnavailable as e:
        logs.warn_once(f"kiln-unavailable-{dev.name}", f"{e} Running graphs eagerly.")
        return _declined(Declined(str(e), dev.name))


def _declined(d: Declined) -> Declined:
    logs.log("perf_hints", f"graph runs eagerly: {d.reason}")
    return d


def _resolve(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[object],
    device: Device | str | None,
    options: Options | None,
) -> Device:
    if isinstance(device, Device):
        return device
    name = device
    if name is None and options is not None:
        name = options.get("codegen.device")  # None: by the tensors' device type
    dev = device_for(example_inputs, gm, name)
    if dev is None:
        kind = tensor_device_type(example_inputs, gm)
        raise GraphUnsupported(
            f"no kiln device compiles {kind} tensors (registered: {', '.join(sorted(DEVICES))}; "
            "kiln.register_device adds one)"
        )
    return dev


def _rewrites(dev: Device, options: Options | None) -> tuple[str, ...]:
    """The device's rewrites, less those an option switches off: `shape_padding=False` leaves
    matmuls unpadded."""
    if options is not None and not options.get("shape_padding"):
        return tuple(r for r in dev.rewrites if r != "pad_matmuls")
    return dev.rewrites


def compile_graph_strict(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[object],
    device: Device | str | None = None,
    options: Options | None = None,
    *,
    checked_inputs: Iterable[int] = (),
    mutated_inputs: Mapping[int, int] | None = None,
    arena: bool = True,
) -> CompiledGraph:
    """`compile_graph` without turning refusals into `Declined`: `GraphUnsupported` and
    `DeviceUnavailable` propagate (tests and tools use this)."""
    dev = _resolve(gm, example_inputs, device, options)
    gen = dev.load_codegen()
    missing = gen.unavailable()
    if missing:
        raise DeviceUnavailable(missing)
    start = time.perf_counter()
    gen.start(options)
    example_inputs = list(example_inputs)
    caps = dev.capabilities

    run_rewrites(gm, example_inputs, _rewrites(dev, options))
    graph = lower_graph(gm, example_inputs, caps)
    logs.log("passes", lambda: f"after lower ({dev.name}):\n{graph}")
    if graph.symbolic and not caps.symbolic_sizes:
        raise GraphUnsupported(
            f"the {dev.name} code generator compiles static sizes only, and this graph's sizes "
            f"are symbolic ({', '.join(sorted(map(str, graph.hints)))}); compile it per size"
        )
    debug = options if options is not None else Options()
    sched = schedule(
        graph,
        fuel=debug.get("debug.fuel"),
        verify_ir=bool(debug.get("debug.verify_ir")),
        out_externs=frozenset(caps.out_variants),
        arena=caps.arena and arena,
        mutations=_mutation_names(graph, mutated_inputs or {}),
        horizontal=caps.horizontal,
        small_arena=caps.small_arena,
        many_programs=caps.many_programs,
    )
    kernels = gen.render(sched, options)
    logs.log("passes", lambda: f"after render ({gen.kernel_language}):\n{kernels.source}")
    checked = frozenset(graph.inputs[i] for i in checked_inputs if i < len(graph.inputs))
    wrapper = gen.wrap(sched, kernels, checked, caps)
    trace.kernels(dev.name, kernels.kernels, wrapper.source)
    logs.log("passes", lambda: f"after wrap:\n{wrapper.source}")
    logs.log(
        "output_code",
        lambda: f"{gen.kernel_language} kernels:\n{kernels.source}\nwrapper:\n{wrapper.source}",
    )
    summary = extern_summary(sched.graph)
    if summary:
        logs.log("perf_hints", f"extern calls in this graph: {summary}")
    # a code generator that can say what it built as data (devices.Loadable) builds by loading
    # that, so the compiled-artifact cache's later load of it is the very same step
    describe = getattr(gen, "loadable", None)
    made = describe(kernels, wrapper, sched, example_inputs) if describe is not None else None
    call = made.load() if made is not None else gen.build(kernels, wrapper, sched, example_inputs)
    seconds = time.perf_counter() - start
    return CompiledGraph(
        call, sched, kernels.source, wrapper.source, seconds, dev.name, gen.kernel_language, made
    )


def _mutation_names(graph: LoopGraph, mutated_inputs: Mapping[int, int]) -> dict[str, str]:
    """{output buffer: input name} for `mutated_inputs` ({output position: input position})."""
    out: dict[str, str] = {}
    for j, i in mutated_inputs.items():
        if j < len(graph.outputs) and i < len(graph.inputs) and isinstance(graph.outputs[j], str):
            out.setdefault(graph.outputs[j], graph.inputs[i])
    return out


__all__ = ["Declined", "DeviceUnavailable", "PASSES", "compile_graph", "compile_graph_strict"]
