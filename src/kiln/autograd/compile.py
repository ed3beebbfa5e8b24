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
values): the same graph called under `torch.no_grad()` compiles once more, forward only.
Capture guards static shapes and dtypes, so they are not part of the key.

Symbolic sizes. A graph capture made with dynamic sizes (placeholders carrying capture's fake
tensors with SymInt sizes) is traced once, in capture's fake mode and shape environment
(symbolic.py): its ATen graphs have symbolic sizes, so one entry serves every size. What a
trace needs to know about the sizes (its hints are the sizes first seen) becomes a guard of the
shape environment; each entry checks the guards AOT tracing added (`GuardedEntry`), and a call
that fails them gets an entry traced for its own sizes (logged under `recompiles`), never a
graph made for other sizes. When capture also guards
everything the key is made of (`CaptureInfo.fixed_call_key`: every input a tensor whose
requires_grad is guarded, and the grad mode), there is one entry and no key is computed per call:
a model passes each parameter, and the key cost a pass over all of them.

The compilers receive the graph and a list of fake tensors with its placeholders' shapes,
strides, dtypes and devices (also in each placeholder's `meta["val"]`; with symbolic sizes,
fake tensors with SymInt sizes, and SymInts for the sizes a backward takes); they return a callable
taking the graph's inputs positionally and returning its outputs as a tuple or list, or a
boxed one (attribute `_boxed_call = True`) that takes the inputs as one list and may empty it
to free each input when it is dead (backend.py's `eager_graph` does; the backward's saved
values are handed over that way).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, Union

import torch
import torch.fx

from .. import logs, trace
from ..gc_pause import paused_gc, saved_tensor_hooks_suspended
from . import decomps
from .analyze import analyze
from .attention_masks import simplify_attention_masks
from .float_inputs import as_tensors, float_positions, graph_device, make_tensor_inputs
from .partition import Partition, partition_joint
from .runtime import InferenceEntry, SymbolicOutputs, TrainingEntry, TrainingPlan
from .symbolic import FakeWorld, needs_shape_env, symbolic_world
from .tensor_scalars import rewrite_tensor_scalars
from .tracing import trace_inference, trace_training
from .zero_tangents import ZeroTangents

if TYPE_CHECKING:
    from .sizes import SizeReader

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
        decompositions: dict | None,
        partition: str,
        fixed_call_key: bool = False,
        world: FakeWorld | None = None,
        guards_from: int = 0,
    ):
        self.gm = gm
        self.fw_compiler = fw_compiler
        self.bw_compiler = bw_compiler
        self.inference_compiler = inference_compiler
        # None: kiln's table, built on the first trace (an entry the store gives needs none)
        self._decompositions = decompositions
        self.partition = partition
        self.entries: dict[tuple, Any] = {}
        # symbolic sizes: capture's fake world; the shape environment's guards from index
        # `guards_from` on are the ones AOT autograd added (capture checks those before)
        self.world = world
        self.reader: SizeReader | None = None
        if world is not None:
            from .sizes import SizeReader  # (sympy: only a graph with symbolic sizes loads it)

            self.reader = SizeReader(world.examples or [])
        self.guards_from = guards_from
        # entries for calls a symbolic entry's guards refused, per (key, input shapes)
        self.sized_entries: dict[tuple, Any] = {}
        self.traces = 0  # AOT traces made (an entry each)
        # capture's guards fix the key (see the module doc): the one entry, once compiled
        self.fixed_key = fixed_call_key
        self.only: Any = None
        self.partitions: dict[tuple, Partition] = {}  # training entries' partition records
        self.float_inputs: list[int] = []  # float inputs passed as 0-d tensors
        self.float_device: torch.device | None = None  # on this device (float_inputs.py)
        self.rewritten = False  # the graph rewrites ran (`_rewrite`, before the first trace)
        # where compiled entries are kept across processes (EntryStore; None: nowhere)
        self.entry_store: EntryStore | None = None
        # called before the first entry is traced and compiled, not when the store gives it
        # (the backend starts its compile workers there: a warm start starts none)
        self.on_compile: Callable[[], None] | None = None

    def _rewrite(self) -> None:
        """The graph rewrites before AOT tracing (the module doc's `once a graph` passes), run
        before the first trace rather than in `aot_compile`: an entry the store gives (a warm
        start) needs none of them, and they run code (a constant mask's subgraph). They are a
        function of the captured graph and its inputs, so the store keys the graph as captured
        (backends/warm.py)."""
        if self.rewritten:
            return
        self.rewritten = True
        notes = simplify_attention_masks(self.gm) + make_tensor_inputs(self.gm, self.float_inputs)
        for note in notes + rewrite_tensor_scalars(self.gm):
            logs.log("aot_graphs", note)

    @property
    def decompositions(self) -> dict:
        if self._decompositions is None:
            self._decompositions = decomps.default_decompositions()
        return self._decompositions

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

    def __call__(self, *args: Any) -> Any:
        if self.float_inputs:  # (float_inputs.py)
            args = tuple(as_tensors(args, self.float_inputs, self.float_device))
        only = self.only
        if only is not None:
            return only(args)
        key = self.key(args)
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = self._new_entry(list(args), key)
        if self.fixed_key:
            self.only = entry
        return entry(args)

    def _new_entry(self, args: list, key: tuple):
        """The entry for `key`: from `entry_store` when it has it (a warm start), else
        compiled, and then offered to the store."""
        store = self.entry_store
        if store is None:
            return self._compile_now(args, key)
        entry = store.load(self, args, key)
        if entry is None:
            symbolic = self.world is not None
            entry = self._compile_now(args, key)
            # (a symbolic graph whose trace fell back to this call's sizes is not kept: its
            # key says symbolic sizes, its entry was made for these)
            if (self.world is not None) == symbolic:
                store.save(self, args, key, entry)
        return entry

    def _compile_now(self, args: list, key: tuple):
        if self.on_compile is not None:
            self.on_compile()
        return self._compile_entry(args, key)

    def _compile_entry(self, args: list, key: tuple):
        """The entry for `key`: symbolic (guarded by what its trace added) when the graph has
        symbolic sizes, else traced for `args`' sizes."""
        if self.world is None or self.reader is None:
            return self._trace_entry(args, key, None)
        from .sizes import guards_since

        env = self.world.shape_env
        entry = self._trace_entry(args, key, self.world)
        guards = guards_since(env, self.guards_from) if env is not None else []
        if not guards:
            return entry
        unreadable = [g for g in guards if not self.reader.can_read(g)]
        if unreadable:  # a fact about sizes no input shows: not checkable, so not used
            logs.log(
                "recompiles",
                f"AOT autograd: shape guard {unreadable[0]} reads no input's size; this graph "
                "is traced per input shape",
            )
            self.world = self.reader = None
            return self._trace_entry(args, key, None)
        text = " and ".join(self.reader.render(g) for g in guards)
        logs.log("guards", f"AOT autograd added shape guards: {text}")
        return GuardedEntry(entry, self.reader.check(guards), text, self, key)

    def sized_entry(self, args: tuple, key: tuple, failed: str):
        """The entry for a call a symbolic entry's guards (`failed`) refused: traced for its
        sizes, kept per input shapes."""
        skey = (key, shape_key(args))
        entry = self.sized_entries.get(skey)
        if entry is None:
            logs.log(
                "recompiles",
                f"AOT autograd: shape guard {failed} fails for input shapes "
                f"{list(skey[1])}; tracing for these sizes",
            )
            entry = self.sized_entries[skey] = self._trace_entry(list(args), key, None)
        return entry

    @trace.timed("aot autograd")
    @paused_gc()  # the garbage collector waits until the entry is compiled (gc_pause.py)
    def _trace_entry(self, args: list, key: tuple, world: FakeWorld | None):
        with saved_tensor_hooks_suspended():
            return self._trace_entry_now(args, key, world)

    def _trace_entry_now(self, args: list, key: tuple, world: FakeWorld | None):
        self.traces += 1
        self._rewrite()
        if world is None and needs_shape_env(self.gm):
            world = FakeWorld.static(shape_env=True)
        grad_enabled = torch.is_grad_enabled()
        meta = analyze(self.gm, args, grad_enabled, world)
        outputs = SymbolicOutputs.of(meta, self.reader) if meta.symbolic and self.reader else None
        if not meta.needs_autograd:
            fwd = trace_inference(self.gm, meta, args, grad_enabled, self.decompositions, world)
            logs.log("aot_graphs", lambda: "inference graph:\n" + _readable(fwd.gm))
            compiled = _compile_inference(self.inference_compiler, fwd.gm, meta, args)
            return InferenceEntry(meta, compiled, _all_tensors(args), outputs)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        joint = trace_training(self.gm, meta, args, grad_enabled, self.decompositions, world)
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
            num_saved_sizes=len(part.saved_sizes),
            zero_tangents=_zero_tangents(part, len(joint.diff_outputs), self.bw_compiler),
        )
        return TrainingEntry(meta, plan, _all_tensors(args), outputs)


def _compile_inference(compiler: Compiler, gm: torch.fx.GraphModule, meta, args: list):
    """The inference graph compiled. A compiler that says it can (`writes_inputs_in_place`,
    as kiln's code generator does) is told which outputs are the new values of mutated
    inputs, {output position: tensor input position}: it may write them into the inputs
    themselves and return those, and the entry then copies nothing back (runtime.py)."""
    examples = _example_inputs(gm)
    if not getattr(compiler, "writes_inputs_in_place", False) or not meta.mutated:
        return compiler(gm, examples)
    tensor_pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    mutated = {
        j: tensor_pos.index(i)
        for j, (i, tracked) in enumerate(zip(meta.mutated, meta.mutated_requires_grad))
        if not tracked and i in tensor_pos
    }
    return compiler(gm, examples, mutated_inputs=mutated)


class GuardedEntry:
    """A symbolic entry and the shape guards its trace added: a call that fails them is
    served by an entry traced for its own sizes (`AotCompiled.sized_entry`)."""

    def __init__(self, entry, check, text: str, owner: AotCompiled, key: tuple) -> None:
        self.entry = entry
        self.check = check
        self.text = text
        self.owner = owner
        self.key = key

    def __call__(self, args) -> Any:
        if self.check(args):
            return self.entry(args)
        return self.owner.sized_entry(args, self.key, self.text)(args)


def shape_key(args) -> tuple:
    """The shapes of a call's tensors (the key of entries traced for one call's sizes)."""
    return tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))


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


def _zero_tangents(part: Partition, num_tangents: int, compiler: Compiler) -> ZeroTangents | None:
    """Backwards for calls whose unused outputs get no gradient, when every tangent's shape is
    fixed (a zeros fill of a symbolic size would need the call's sizes): see zero_tangents.py."""
    zeros = ZeroTangents(part.bw, num_tangents, compiler)
    return zeros if num_tangents and zeros.supports(tuple(range(num_tangents))) else None


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
    on_compile: Callable[[], None] | None = None,
) -> Callable:
    """Compile a captured graph ahead of time: functional ATen graphs, forward/backward split.

    `decompositions=None` uses kiln's table (`kiln.autograd.decomps`); pass `{}` for none.
    `partition` is `"min_cut"` (recompute cheap ops in the backward) or `"save_all"`.
    `fixed_call_key`: the caller's guards fix everything the per-call key is made of
    (`CaptureInfo.fixed_call_key`), so calls after the first skip computing it.
    `entry_store`: where entries are looked up before compiling and kept after (EntryStore).
    `on_compile()`: called before the first entry is compiled (not when the store has it).
    The entry for `example_inputs` (under the current grad mode) is compiled right away.
    """
    world = symbolic_world(gm)
    env = world.shape_env if world is not None else None
    guards_from = len(env.guards) if env is not None else 0  # (capture checks the ones before)
    floats = float_positions(gm, example_inputs)
    float_device = graph_device(example_inputs) if floats else None
    if floats:
        example_inputs = as_tensors(example_inputs, floats, float_device)
    if decompositions is None:
        logs.once(
            "aot-decomps", "aot_graphs", lambda: "kiln decomposition table:\n" + decomps.describe()
        )
    compiled = AotCompiled(
        gm,
        fw_compiler,
        bw_compiler,
        inference_compiler or fw_compiler,
        decompositions,
        partition,
        fixed_call_key,
        world,
        guards_from,
    )
    compiled.float_inputs, compiled.float_device = floats, float_device
    compiled.entry_store = entry_store
    compiled.on_compile = on_compile
    key = compiled.key(example_inputs)
    entry = compiled.entries[key] = compiled._new_entry(list(example_inputs), key)
    compiled.on_compile = None  # (the backend stops its workers once this returns)
    if compiled.fixed_key:  # calls after this one skip the key (the first may not come here)
        compiled.only = entry
    return compiled
