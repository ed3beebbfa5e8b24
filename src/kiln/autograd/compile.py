"""`aot_compile`: the autograd stage's pipeline, from a captured graph to a compiled callable.

Takes a torch-level `GraphModule` (placeholders: user tensors and lifted parameters/buffers;
output: a tuple of tensors), the call's example inputs, and the compilers of the next stage;
gives a callable that takes the flat inputs positionally and returns what the graph returns.

The pipeline, one named call a pass (`_compile_entry`):

    simplify_attention_masks     once a graph: constant attention masks that mask nothing or
                                 are causal leave the SDPA call (its fused kernels take no mask)
    make_tensor_inputs           once a graph: float inputs (capture's symbolic floats) become
                                 0-d float64 tensor inputs, so a new value compiles nothing
    rewrite_tensor_scalars       once a graph: `alpha=`/`value=` given as a tensor becomes
                                 tensor arithmetic (eager reads it with .item())
    analyze                      fake run: mutated inputs, output aliasing, requires_grad
    trace_inference              no gradient needed: one functional decomposed graph, or
    trace_training -> partition_joint
                                 training: joint fw+bw (one trace, or two when an input is
                                 mutated), min-cut split
    fw_compiler / bw_compiler    the next stage (eager ATen for aot_eager)

An `entry_store` (the backend's compiled-artifact cache) may give an entry instead of the
pipeline: a new process then skips every pass above for a graph compiled before.

A compiled callable holds one entry per (grad mode, which inputs require grad, non-tensor input
values; for a graph capture made with dynamic sizes, the input shapes too, since the code
generators compile for concrete sizes): the same graph called under `torch.no_grad()` compiles
once more, forward only.
Capture guards static shapes and dtypes, so they are not part of the key. When capture also guards
everything the key is made of (`CaptureInfo.fixed_call_key`: every input a tensor whose
requires_grad is guarded, and the grad mode), there is one entry and no key is computed per call:
a model passes each parameter, and the key cost a pass over all of them.

The compilers receive the graph and a list of fake tensors with its placeholders' shapes,
strides, dtypes and devices (also in each placeholder's `meta["val"]`); they return a callable
taking the graph's inputs positionally and returning its outputs as a tuple or list, or a
boxed one (attribute `_boxed_call = True`) that takes the inputs as one list and may empty it
to free each input when it is dead (backend.py's `eager_graph` does; the backward's saved
values are handed over that way).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Union

import torch
import torch.fx

from .. import logs, trace
from ..gc_pause import paused_gc
from . import decomps
from .analyze import analyze
from .attention_masks import simplify_attention_masks
from .float_inputs import as_tensors, float_positions, make_tensor_inputs
from .partition import Partition, partition_joint
from .runtime import InferenceEntry, TrainingEntry, TrainingPlan
from .tensor_scalars import rewrite_tensor_scalars
from .tracing import trace_inference, trace_training

Compiler = Callable[[torch.fx.GraphModule, list], Callable]
Entry = Union[InferenceEntry, TrainingEntry]


class EntryStore(Protocol):
    """Compiled entries kept beyond this process (the backend's compiled-artifact cache,
    backends/warm.py): `load` gives the entry of `compiled`'s graph for a call with `args`
    and entry key `key`, or None; `save` offers a newly compiled one (it may decline it)."""

    def load(self, compiled: AotCompiled, args: list, key: tuple) -> Entry | None: ...

    def save(self, compiled: AotCompiled, args: list, key: tuple, entry: Entry) -> None: ...


def _example_inputs(gm: torch.fx.GraphModule) -> list:
    return [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]


def _readable(gm: torch.fx.GraphModule) -> str:
    return gm.print_readable(print_output=False)


class AotCompiled:
    """The callable `aot_compile` returns; compiles an entry per call signature on demand."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        fw_compiler: Compiler,
        bw_compiler: Compiler,
        inference_compiler: Compiler,
        decompositions: dict,
        partition: str,
        fixed_call_key: bool = False,
    ):
        self.gm = gm
        self.fw_compiler = fw_compiler
        self.bw_compiler = bw_compiler
        self.inference_compiler = inference_compiler
        self.decompositions = decompositions
        self.partition = partition
        self.entries: dict[tuple, InferenceEntry | TrainingEntry] = {}
        # a graph with dynamic sizes is compiled once per input shape (see `entry_key`)
        self.dynamic = has_symbolic_sizes(gm)
        # capture's guards fix the key (see the module doc): the one entry, once compiled
        self.fixed_key = fixed_call_key and not self.dynamic
        self.only: InferenceEntry | TrainingEntry | None = None
        self.partitions: dict[tuple, Partition] = {}  # training entries' partition records
        self.float_inputs: list[int] = []  # float inputs passed as 0-d tensors
        # where compiled entries are kept across processes (EntryStore; None: nowhere)
        self.entry_store: EntryStore | None = None

    @staticmethod
    def key(args) -> tuple:
        """Grad mode, each tensor's requires_grad, each plain value (they are baked in).
        Runs on every call (a model passes each parameter): tensors are tested by exact type
        first, which is cheaper than `isinstance` against `Parameter`'s metaclass."""
        rg = []
        for a in args:
            t = type(a)
            if t in _TENSOR_TYPES or isinstance(a, torch.Tensor):
                rg.append(a.requires_grad)
            elif t in _PLAIN_TYPES or isinstance(a, (int, float, str)):  # IntEnum: by value
                rg.append((a,))  # not a bare bool: a tensor's slot holds its requires_grad
            else:
                rg.append(t)
        return (torch.is_grad_enabled(), tuple(rg))

    def entry_key(self, args) -> tuple:
        """`key`, and for a graph with dynamic sizes the input shapes (`shape_key`)."""
        key = self.key(args)
        return (*key, shape_key(args)) if self.dynamic else key

    def __call__(self, *args: Any) -> Any:
        if self.float_inputs:  # (float_inputs.py)
            args = tuple(as_tensors(args, self.float_inputs))
        only = self.only
        if only is not None:
            return only(args)
        key = self.entry_key(args)
        entry = self.entries.get(key)
        if entry is None:
            if self.dynamic and self.entries:
                logs.log("recompiles", lambda: _specializing(args))
            entry = self.entries[key] = self._new_entry(list(args), key)
        if self.fixed_key:
            self.only = entry
        return entry(args)

    def _new_entry(self, args: list, key: tuple):
        """The entry for `key`: from `entry_store` when it has it (a warm start), else
        compiled, and then offered to the store."""
        store = self.entry_store
        if store is None:
            return self._compile_entry(args, key)
        entry = store.load(self, args, key)
        if entry is None:
            entry = self._compile_entry(args, key)
            store.save(self, args, key, entry)
        return entry

    @trace.timed("aot autograd")
    @paused_gc()  # the garbage collector waits until the entry is compiled (gc_pause.py)
    def _compile_entry(self, args: list, key: tuple):
        grad_enabled = torch.is_grad_enabled()
        meta = analyze(self.gm, args, grad_enabled)
        if not meta.needs_autograd:
            fwd = trace_inference(self.gm, meta, args, grad_enabled, self.decompositions)
            logs.log("aot_graphs", lambda: "inference graph:\n" + _readable(fwd.gm))
            compiled = self.inference_compiler(fwd.gm, _example_inputs(fwd.gm))
            return InferenceEntry(meta, compiled, _all_tensors(args))
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        joint = trace_training(self.gm, meta, args, grad_enabled, self.decompositions)
        part = partition_joint(joint, self.partition)
        self.partitions[key] = part
        logs.log("aot_graphs", lambda: _describe_partition(part))
        # the backward first: most of a training step's kernels are its, and its parallel
        # compile (triton_builder.warm) then runs while the forward is lowered
        compiled_bw = self.bw_compiler(part.bw, _example_inputs(part.bw))
        compiled_fw = self.fw_compiler(part.fw, _example_inputs(part.fw))
        plan = TrainingPlan(
            fw=compiled_fw,
            bw=compiled_bw,
            num_fw_outputs=part.num_fw_outputs,
            diff_outputs=joint.diff_outputs,
            non_diff_outputs=[
                j for j in range(part.num_fw_outputs) if j not in set(joint.diff_outputs)
            ],
            diff_inputs=joint.diff_inputs,
            grad_present=part.grad_present,
            num_tensor_inputs=len(tensors),
            clone_saved=_saved_mutated_inputs(part, meta.mutated, args),
        )
        return TrainingEntry(meta, plan, _all_tensors(args))


def has_symbolic_sizes(gm: torch.fx.GraphModule) -> bool:
    """Whether capture gave the graph dynamic sizes (placeholders whose example values have
    symbolic sizes). kiln's code generators compile for concrete sizes, so such a graph gets
    an entry per input shape: a new shape compiles again instead of reaching a compiled graph
    that was made for another one."""
    for n in gm.graph.find_nodes(op="placeholder"):
        val = n.meta.get("example_value", n.meta.get("val"))
        if isinstance(val, torch.Tensor) and any(
            not isinstance(d, int) for d in (*val.shape, *val.stride())
        ):
            return True
        if isinstance(val, torch.SymInt):
            return True
    return False


def shape_key(args) -> tuple:
    """The shapes of a call's tensors: the part of a dynamic graph's entry key that capture's
    guards leave open."""
    return tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))


def _specializing(args) -> str:
    return (
        "a graph with dynamic sizes is compiled again for input shapes "
        f"{list(shape_key(args))}: kiln's code generators compile for concrete sizes"
    )


def _all_tensors(args: list) -> bool:
    """Every input is a tensor: an entry passes them on without filtering. (The key records
    which positions are tensors, so an entry's calls all have the same ones.)"""
    return all(isinstance(a, torch.Tensor) for a in args)


_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
_PLAIN_TYPES = frozenset({int, float, bool, str, type(None)})


def _saved_mutated_inputs(part: Partition, mutated: list[int], args: list) -> list[int]:
    """Saved values that are inputs the runtime will overwrite: they are saved as copies,
    or the backward would read the new value (and autograd's version check would fire)."""
    tensor_pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    placeholders = [n.name for n in part.fw.graph.find_nodes(op="placeholder")]
    mutated_names = {placeholders[tensor_pos.index(i)] for i in mutated}
    return [k for k, name in enumerate(part.saved) if name in mutated_names]


def _describe_partition(part: Partition) -> str:
    lines = [
        f"partition ({part.strategy}): saved {len(part.saved)} values, "
        f"{part.saved_bytes} bytes: {', '.join(part.saved) or '-'}",
        f"recomputed in backward ({len(part.recomputed)}): {', '.join(part.recomputed) or '-'}",
        *part.notes,
        "forward graph:",
        _readable(part.fw),
        "backward graph:",
        _readable(part.bw),
    ]
    return "\n".join(lines)


def aot_compile(
    gm: torch.fx.GraphModule,
    example_inputs: list,
    *,
    fw_compiler: Compiler,
    bw_compiler: Compiler,
    inference_compiler: Compiler | None = None,
    decompositions: dict | None = None,
    partition: str = "min_cut",
    fixed_call_key: bool = False,
    entry_store: EntryStore | None = None,
) -> Callable:
    """Compile a captured graph ahead of time: functional ATen graphs, forward/backward split.

    `decompositions=None` uses kiln's table (`kiln.autograd.decomps`); pass `{}` for none.
    `partition` is `"min_cut"` (recompute cheap ops in the backward) or `"save_all"`.
    `fixed_call_key`: the caller's guards fix everything the per-call key is made of
    (`CaptureInfo.fixed_call_key`), so calls after the first skip computing it.
    `entry_store`: where entries are looked up before compiling and kept after (EntryStore).
    The entry for `example_inputs` (under the current grad mode) is compiled right away.
    """
    floats = float_positions(gm, example_inputs)
    notes = simplify_attention_masks(gm) + make_tensor_inputs(gm, floats)
    for note in notes + rewrite_tensor_scalars(gm):
        logs.log("aot_graphs", note)
    if floats:
        example_inputs = as_tensors(example_inputs, floats)
    if decompositions is None:
        logs.once("aot-decomps", "aot_graphs", "kiln decomposition table:\n" + decomps.describe())
    compiled = AotCompiled(
        gm,
        fw_compiler,
        bw_compiler,
        inference_compiler or fw_compiler,
        decomps.default_decompositions() if decompositions is None else decompositions,
        partition,
        fixed_call_key,
    )
    compiled.float_inputs = floats
    compiled.entry_store = entry_store
    key = compiled.entry_key(example_inputs)
    entry = compiled.entries[key] = compiled._new_entry(list(example_inputs), key)
    if compiled.fixed_key:  # calls after this one skip the key (the first may not come here)
        compiled.only = entry
    return compiled
