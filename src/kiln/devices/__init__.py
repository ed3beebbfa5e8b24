"""devices/: the device interface — what a compile target is, and the registry of them.

In: nothing but torch. Out: `Device` (a frozen description of one compile target),
`Capabilities` (what its kernels can do, read by lower/ and schedule/), `CodeGen` (the protocol
its renderer, wrapper and builder implement), and the registry (`register_device`, `get_device`,
`device_for`). `cpu` (C++/OpenMP, codegen/cpp) and `cuda` (Triton, codegen/triton) are the
built-in devices; another accelerator registers its own with `kiln.register_device`, e.g.

    kiln.register_device("npu", kiln.devices.Device(
        name="npu", tensor_type="npu",
        capabilities=kiln.devices.Capabilities(dtypes=...),
        rewrites=("functionalize_restrides", "fake_metadata", "merge_repeats"),
        codegen="my_npu_package.codegen:NPU_CODEGEN",
        graph_runner="my_npu_package.graphs:NpuGraphs"))

and every graph whose tensors live on `npu` goes through kiln's one pipeline
(codegen/pipeline.py) with that device's rewrites, capabilities, renderer and builder.
docs/architecture.md says how to write one.

Code generators and graph runners are named as `"module:attribute"` and imported on first use,
so importing kiln imports neither Triton nor any vendor package.

Why it exists: adding a device is a plug-in — a value handed to one pipeline — not a third copy
of the pipeline.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

import torch

if TYPE_CHECKING:  # the type a build returns while kernels still compile (codegen/compiled.py)
    from ..codegen.compiled import FirstCall

# Every dtype loop IR can express; a device lists the ones its kernels read and write.
LOOP_DTYPES = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    }
)


@dataclass(frozen=True, eq=False)
class Capabilities:
    """What a device's kernels can do; lower/ and schedule/ read it and nothing device-specific.

    dtypes: tensors of other dtypes stay ATen calls (never read or written by a kernel).
    indirect_loads: kernels may read memory at indices loaded from memory (gather, embedding,
        index): lowerings emit `Indirect` index terms; without it those ops stay ATen calls.
    out_variants: ATen ops (matmuls) the wrapper calls with `out=` into a buffer the memory plan
        gives, mapped to their `.out` overloads; the plan may then reuse their outputs.
    arena: intermediates live in one block the wrapper keeps from call to call (schedule/arena).
    symbolic_sizes: kernels and wrapper take sizes known only per call (lower/symbolic.py);
        without it a graph with symbolic sizes is declined.
    horizontal: the most buffer arguments of a horizontal kernel, which runs independent
        pointwise kernels side by side in one launch (schedule/horizontal.py); 0: the renderer
        has no such kernels, and none are made.
    small_arena: without `arena`, intermediates of at most this many bytes (one-value ones)
        live in a block the wrapper keeps from call to call (schedule/arena.py
        `plan_small_arena`); 0: none do.
    many_programs: kernels run as many short programs (GPU blocks) at once, each computing a
        block of elements: a one-value expression costs once per program, not per element, so
        a cheap one-value producer (an optimizer's bias correction from its step count) is
        recomputed by its readers instead of stored by a kernel of its own (schedule/realize.py);
        and a kernel's independent member sets run as horizontal parts, each in programs of
        its own, rather than one after another in every program (schedule/wide.py). False on
        the CPU: its threads each walk one loop nest over every set, where a one-value
        expression inlined in the loop is computed per element.
    """

    dtypes: frozenset = LOOP_DTYPES
    indirect_loads: bool = False
    out_variants: Mapping[Any, Any] = field(default_factory=lambda: MappingProxyType({}))
    arena: bool = False
    symbolic_sizes: bool = False
    horizontal: int = 0
    small_arena: int = 0
    many_programs: bool = False


class CodeGen(Protocol):
    """A device's code generator: the pipeline's last three passes (render, wrap, build).

    `unavailable()` says why this machine cannot build for the device (None when it can: a
    missing compiler or package is a reason, and the graph then runs on eager kernels).
    `start(options)` may begin slow set-up early (compile workers). `render` turns a schedule
    into kernel source (an object with `.source` and `.kernels`), `wrap` into the wrapper
    program (`.source`, `.externs`), and `build` gives the wrapper's `call(args: list)`, or a
    `codegen.compiled.FirstCall` whose first run waits for kernels still compiling.
    """

    kernel_language: str

    def unavailable(self) -> str | None: ...

    def start(self, options: Any) -> None: ...

    def render(self, sched: Any, options: Any) -> Any: ...

    def wrap(
        self, sched: Any, kernels: Any, checked_inputs: frozenset, capabilities: Capabilities
    ) -> Any: ...

    def build(
        self, kernels: Any, wrapper: Any, sched: Any, example_inputs: list
    ) -> Callable | FirstCall: ...

    # Optional: `loadable(kernels, wrapper, sched, example_inputs) -> Loadable | None`, the
    # build as data (see `Loadable`); a code generator without it is never warm-started.


@dataclass(frozen=True)
class Loadable:
    """A built graph as data: `load()` makes the wrapper's `call` (or a `FirstCall`) again.

    `loader` is a "module:function" light to import (no lowering, scheduling or rendering
    modules: those are what a warm start saves), `data` plain values it takes (sources, kernel
    names, op names, constant tensors) that pickle. The compiled-artifact cache
    (backends/warm.py) stores it, so that a new process loads the graph from it instead of
    compiling it again; the kernels themselves come from the builders' caches by content.
    """

    loader: str
    data: Mapping[str, Any]

    def load(self) -> Callable | FirstCall:
        return _load(self.loader)(self.data)


def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True, eq=False)
class Device:
    """One compile target (see the module doc).

    name: the registry key (`options={"codegen.device": name}` picks it explicitly).
    tensor_type: the torch device type of the tensors its kernels run on ("cpu", "cuda", ...).
    capabilities: what its kernels can do.
    rewrites: the named ATen rewrites (kiln/rewrites) run before lowering, in order.
    codegen: a `CodeGen`, or its "module:attribute".
    graph_runner: its device graphs (runtime/device_graphs.DeviceGraphs), or their
        "module:attribute"; None when the device has none (reduce-overhead then runs the
        compiled graphs as they are, and says why).
    """

    name: str
    tensor_type: str
    capabilities: Capabilities
    rewrites: tuple[str, ...]
    codegen: Any
    graph_runner: Any = None
    description: str = ""

    # Imported on first use when named as "module:attribute", then kept on this Device itself
    # (a copy made with dataclasses.replace loads its own).
    @functools.cached_property
    def _codegen(self) -> CodeGen:
        return _load(self.codegen) if isinstance(self.codegen, str) else self.codegen

    @functools.cached_property
    def _graph_runner(self) -> Any:
        runner = self.graph_runner
        return _load(runner) if isinstance(runner, str) else runner

    def load_codegen(self) -> CodeGen:
        return self._codegen

    def load_graph_runner(self) -> Any:
        return self._graph_runner


DEVICES: dict[str, Device] = {}


def register_device(name: str, device: Device) -> Device:
    """Register (or replace) the compile target `name`. A device registered under the name of
    its tensor type (`"npu"` for npu tensors) compiles every graph on those tensors; one under
    another name is chosen with `options={"codegen.device": name}`."""
    if not isinstance(device, Device):
        raise TypeError(
            f"register_device({name!r}, ...) takes a kiln.devices.Device, got "
            f"{type(device).__name__}"
        )
    if device.name != name:
        raise ValueError(f"register_device: the name {name!r} differs from device.name")
    try:
        torch.device(device.tensor_type)
    except RuntimeError as e:
        raise ValueError(f"{device.tensor_type!r} is not a torch device type: {e}") from None
    from ..rewrites import check_names  # the device's rewrites must exist

    check_names(device.rewrites)
    DEVICES[name] = device
    return device


def unregister_device(name: str) -> None:
    DEVICES.pop(name, None)


def get_device(name: str) -> Device:
    if name not in DEVICES:
        raise KeyError(
            f"kiln has no device {name!r}; registered: {', '.join(sorted(DEVICES))}. Register "
            "one with kiln.register_device(name, kiln.devices.Device(...))."
        )
    return DEVICES[name]


def _tensors(values: Iterable[object]) -> Iterator[torch.Tensor]:
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)


def accelerator_of(values: Iterable[object]) -> torch.device | None:
    """The device a graph's kernels run on, from its tensors (nested lists and tuples too): that
    of the first tensor not on the CPU (a CPU scalar beside CUDA tensors is copied over by the
    wrapper, or read by the ATen call that takes it); None when every tensor is on the CPU.
    The one rule for lower/, the pipeline and the device's builder."""
    for t in _tensors(values):
        if t.device.type not in ("cpu", "meta"):
            return t.device
    return None


def tensor_device_type(
    example_inputs: Sequence[object], gm: torch.fx.GraphModule | None = None
) -> str:
    """The device type of a graph's tensors, its inputs and its constants (`accelerator_of`),
    "cpu" when all are on the CPU."""
    tensors = list(example_inputs)
    if gm is not None:
        tensors += [getattr(gm, n.target, None) for n in gm.graph.nodes if n.op == "get_attr"]
    found = accelerator_of(tensors)
    return found.type if found is not None else "cpu"


def device_for(
    example_inputs: Sequence[object],
    gm: torch.fx.GraphModule | None = None,
    name: str | None = None,
) -> Device | None:
    """The device that compiles a graph: `name` when given, else the one registered under its
    tensors' device type; None when there is none (the graph then runs on eager kernels)."""
    if name is not None:
        return get_device(name)
    return DEVICES.get(tensor_device_type(example_inputs, gm))


def graph_runner_for(tensor_type: str) -> Any:
    """The device graphs of the device registered for `tensor_type`, None if it has none."""
    device = DEVICES.get(tensor_type)
    return device.load_graph_runner() if device is not None else None


__all__ = [
    "Capabilities",
    "CodeGen",
    "DEVICES",
    "Device",
    "LOOP_DTYPES",
    "Loadable",
    "accelerator_of",
    "device_for",
    "get_device",
    "graph_runner_for",
    "register_device",
    "tensor_device_type",
    "unregister_device",
]


from . import builtin  # noqa: E402,F401  (registers cpu and cuda)
