"""Device graphs: capture a compiled callable's kernel launches once per input signature, replay.

Takes a compiled callable (plain, or boxed: `_boxed_call`, one list of inputs) and gives a boxed
callable that, for each input signature (shapes, strides, dtypes, devices, plain values and the
addresses of static inputs), runs once normally (the warm-up, which also initialises lazy
state such as cuBLAS handles), captures the launches of a second run into a
device graph, and from then on copies the non-static inputs into the graph's static input buffers
and replays it. Static inputs (`nn.Parameter`s and positions the caller names) are used in place.
All graphs of one `GraphGroup` (a compiled function's forward, backward and inference graphs)
allocate from one memory pool, so the temporaries of every shape share memory and a set of
shapes costs little more than the largest one.

Outputs are the graph's static buffers, wrapped as `GraphOutput`s (device_graphs_outputs.py) that
raise a clear error when read after a later replay overwrote them. Outputs of a backward graph
(gradients, which autograd may keep as `.grad`) are cloned instead.

Falls back to running the callable as it is, logging why once under `KILN_LOGS=perf_hints`, for:
tensors on a device without a graph implementation (CPU), inputs the callable mutates (seen by
`_version` across the warm-up), more than `max_shapes` signatures, and capture errors (ops that
cannot be captured), and graphs that communicate (functional collectives, `_c10d_functional.*`:
a capture must happen on every rank in lock-step, and a collective replayed by one rank and
run normally by another hangs both; `device_graph_refusal`). A training forward also runs
without its graph when the backward of its
previous replay has not run yet (its saved activations live in the graph's buffers), unless
`kiln.mark_step_begin()` was called in between.

`DeviceGraphs` is the device-neutral interface (pool, warm-up, capture, replay); `CudaGraphs`,
over `torch.cuda.CUDAGraph`, is the one implementation (`CUDA_GRAPHS`, the cuda device's graph
runner). Another device names its own as `Device.graph_runner` (kiln.devices).
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import Any, Callable, Sequence

import torch

from .. import logs, native
from ..devices import graph_runner_for
from .device_graphs_outputs import (
    Generation,
    GraphOutput,
    check_output,
    current_step,
    mark_step_begin,
)

__all__ = [
    "CudaGraphs",
    "DeviceGraphs",
    "GraphGroup",
    "GraphedCallable",
    "CUDA_GRAPHS",
    "device_graph_refusal",
    "mark_step_begin",
    "wrap_compilers",
]

DEFAULT_MAX_SHAPES = 8

# graphs recorded in this process, by the label of their group (a compiled function's name):
# what shape handling's gears are measured by (runtime/shape_handling.py, its GPU test)
RECORDED: Counter[str] = Counter()


class DeviceGraphs:
    """What a device offers for graphs. Methods take and return opaque graph/pool objects."""

    def new_pool(self) -> Any:
        raise NotImplementedError

    def warmup(self, run: Callable[[], Any]) -> Any:
        """Run once outside any graph (e.g. on a side stream); return the result."""
        raise NotImplementedError

    def capture(self, run: Callable[[], Any], pool: Any) -> tuple[Any, Any]:
        """Capture `run()`'s launches into a graph allocating from `pool`; (graph, outputs)."""
        raise NotImplementedError

    def replay(self, graph: Any) -> None:
        raise NotImplementedError


class CudaGraphs(DeviceGraphs):
    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def warmup(self, run: Callable[[], Any]) -> Any:
        # On the caller's stream: the warm-up's results go back to the caller, and tensors
        # allocated on a side stream but used and freed on this one could be handed out again
        # while this stream still reads them. (The capture runs on torch.cuda.graph's stream.)
        return run()

    def capture(self, run: Callable[[], Any], pool: Any) -> tuple[Any, Any]:
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: a backward graph is captured on the autograd engine's thread
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                out = run()
        except Exception:
            _reset_rng_after_failed_capture()
            raise
        return graph, out

    def replay(self, graph: Any) -> None:
        graph.replay()


def _reset_rng_after_failed_capture() -> None:
    """A capture that fails leaves the device's default generator marked as capturing, and
    every later random op raises ("Offset increment outside graph capture"). A clone of its
    state (same seed and offset) is not marked, so it takes the stuck state's place."""
    gen = torch.cuda.default_generators[torch.cuda.current_device()]
    gen.graphsafe_set_state(gen.clone_state())


CUDA_GRAPHS = CudaGraphs()


class GraphGroup:
    """The graphs of one compiled function: one memory pool, shared options.

    `static_inputs`: positions of the forward's inputs that are the model's own parameters or
    buffers (capture knows which), read in place like `nn.Parameter`s are. Without it a
    channels-last ResNet-50's 106 batch-norm running statistics were copied into static
    buffers before every replay: 107 device-to-device copies, 110 us of a 1.75 ms step."""

    def __init__(
        self,
        label: str = "a compiled graph",
        max_shapes: int = DEFAULT_MAX_SHAPES,
        static_inputs: Sequence[int] = (),
    ):
        self.label = label
        self.max_shapes = max_shapes
        self.static_inputs = tuple(static_inputs)
        self.pools: dict[str, Any] = {}

    def pool(self, impl_name: str, impl: DeviceGraphs) -> Any:
        if impl_name not in self.pools:
            self.pools[impl_name] = impl.new_pool()
        return self.pools[impl_name]


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (list, tuple)) else (out,)


class _Recorded:
    """One captured graph: its static inputs and outputs and its replay count."""

    def __init__(
        self, graph, static_inputs: list, outputs: tuple, generation: Generation, impl: str
    ):
        self.graph = graph
        self.static_inputs = static_inputs
        self.impl = impl
        self.copied: list[int] = []  # positions copied into their buffer before each replay
        # positions whose static input is another graph's output buffer, read in place (a
        # backward reading its forward's saved values): never copied into, see `_replay`
        self.borrowed: frozenset[int] = frozenset()
        self.outputs = outputs
        self.generation = generation
        self.output_ptrs = {o.data_ptr() for o in outputs if isinstance(o, torch.Tensor)}


class GraphedCallable:
    """A boxed callable replaying device graphs of `fn`, one per input signature."""

    _boxed_call = True

    def __init__(
        self,
        fn: Callable,
        group: GraphGroup,
        *,
        name: str = "forward",
        static_inputs: Sequence[int] = (),
        clone_outputs: bool = False,
    ):
        self.fn = fn
        self.group = group
        self.name = name
        self.static_positions = frozenset(static_inputs)
        self.clone_outputs = clone_outputs
        self.recorded: dict[tuple, _Recorded] = {}
        self.failed: dict[tuple, str] = {}  # signature -> why it runs without a graph
        self.warmed: set[tuple] = set()
        # training forward: signatures replayed whose backward has not run yet
        self.pending: set[tuple] = set()
        self.pending_step = current_step()
        self.backward_of: GraphedCallable | None = None  # set on a backward: its forward
        # `_split`'s classification of input positions, made for `_statics_of` inputs
        self._statics_of = -1
        self._statics: frozenset[int] = frozenset()
        self._others: tuple[int, ...] = ()
        self._pick: Callable[[list], tuple] = _getter(())
        native.start()  # reads the static addresses of each call, once it has loaded

    # -- plain execution -------------------------------------------------------------------
    def _run(self, args: list) -> tuple:
        if getattr(self.fn, "_boxed_call", False):
            return _as_tuple(self.fn(list(args)))
        return _as_tuple(self.fn(*args))

    def _fallback(self, key: tuple | None, reason: str, args: list) -> tuple:
        self._give_up(key, reason)
        return self._run(args)

    def _give_up(self, key: tuple | None, reason: str) -> None:
        """Log (once) why this callable, or one signature of it, runs without a graph."""
        logs.once(
            f"device_graphs:{id(self)}:{reason}",
            "perf_hints",
            f"device graphs: the {self.name} graph of {self.group.label} runs without a device "
            f"graph: {reason}",
        )
        if key is not None:
            self.failed[key] = reason

    # -- signatures ------------------------------------------------------------------------
    def _is_static(self, i: int) -> bool:
        return i in self._statics

    def _split(self, args: list) -> tuple[Any, tuple[int, ...]]:
        """Which positions are static, fixed at the first call: those the caller named and those
        holding an `nn.Parameter` then. Gives a getter of the static inputs (one C call per
        signature, rather than a Python test per input: a model passes every parameter) and
        the other positions."""
        if self._statics_of != len(args):
            statics = sorted(
                i
                for i, a in enumerate(args)
                if isinstance(a, torch.Tensor)
                and (i in self.static_positions or isinstance(a, torch.nn.Parameter))
            )
            self._statics = frozenset(statics)
            self._others = tuple(i for i in range(len(args)) if i not in self._statics)
            self._pick = _getter(statics)
            self._statics_of = len(args)
        return self._pick, self._others

    def _signature(self, args: list) -> tuple:
        """What selects a graph: a static input by its address (a graph reads it in place, so
        another tensor there needs another graph), any other tensor by its layout."""
        pick, others = self._split(args)
        try:
            ptrs = native.data_ptrs(pick(args))
        except (AttributeError, TypeError):  # a static position holds no tensor this time
            ptrs = tuple(map(_address_or_type, pick(args)))
        sig = []
        for i in others:
            a = args[i]
            if isinstance(a, torch.Tensor):
                sig.append((a.shape, a.stride(), a.dtype, a.device))
            elif isinstance(a, (int, float, bool, str, type(None))):
                sig.append((type(a), a))
            else:
                sig.append(type(a))
        return ptrs, tuple(sig)

    def _implementation(self, args: list) -> tuple[str | None, str]:
        types = {a.device.type for a in args if isinstance(a, torch.Tensor)}
        if not types:
            return None, "it has no tensor inputs"
        if len(types) > 1:
            return None, f"its inputs are on several device types ({', '.join(sorted(types))})"
        (dev,) = types
        if graph_runner_for(dev) is None:
            return None, (
                f"its inputs are {dev.upper()} tensors, and kiln's {dev} device has no device "
                "graphs (Device.graph_runner)"
            )
        return dev, ""

    # -- the call --------------------------------------------------------------------------
    def __call__(self, args_list: list) -> tuple:
        args = list(args_list)
        args_list.clear()  # the boxed convention: the caller's references go now
        # An output of an earlier replay that a later one overwrote raises here, once per
        # argument; past this check nothing needs `GraphOutput`'s per-access test, whose Python
        # call on every `.shape`, `.stride()`, `.data_ptr()` and op was most of a training
        # step's host time on the GPU (the backward reads each saved value 5 times: 20 calls a
        # step for a 2-layer MLP). The compiled code reads its arguments as plain tensors, as
        # it was traced.
        for a in args:
            if type(a) is GraphOutput:
                check_output(a)
        with torch._C.DisableTorchFunctionSubclass():
            return self._call(args)

    def _call(self, args: list) -> tuple:
        key = self._signature(args)
        rec = self.recorded.get(key)
        if rec is not None:
            impl_name = rec.impl  # a recorded signature: its device was checked then
        else:
            impl_name, why = self._implementation(args)
            if impl_name is None:
                return self._fallback(None, why, args)
        if key in self.failed:
            return self._run(args)
        if self.backward_of is not None:
            self.backward_of._consumed(args)
        if rec is None:
            if len(self.recorded) >= self.group.max_shapes:
                return self._fallback(
                    key,
                    f"more than {self.group.max_shapes} input signatures (shapes) were recorded; "
                    "new ones run without a graph (raise `max_shapes`, or mark the varying "
                    "dimension dynamic and pad inputs to a few sizes)",
                    args,
                )
            return self._record(key, impl_name, args)
        if self._blocked_by_pending(key):
            return self._run(args)
        return self._replay(key, rec, impl_name, args)

    def _blocked_by_pending(self, key: tuple) -> bool:
        if self.backward_of is not None or not self.pending_tracking:
            return False
        if self.pending_step != current_step():
            self.pending.clear()
            self.pending_step = current_step()
        if key in self.pending:
            logs.once(
                f"device_graphs:{id(self)}:pending",
                "perf_hints",
                f"device graphs: the forward of {self.group.label} ran again before the backward "
                "of its previous call; its saved values live in the graph's buffers, so this call "
                "runs without the graph. Call kiln.mark_step_begin() at the start of each step if "
                "earlier calls' outputs are no longer needed.",
            )
            return True
        return False

    pending_tracking = False  # set for a training forward by `wrap_compilers`

    def _consumed(self, bw_args: list) -> None:
        """A backward ran: the forward replay whose outputs it reads is no longer pending."""
        ptrs = {a.data_ptr() for a in bw_args if isinstance(a, torch.Tensor)}
        for key in list(self.pending):
            rec = self.recorded.get(key)
            if rec is not None and rec.output_ptrs & ptrs:
                self.pending.discard(key)

    def _record(self, key: tuple, impl_name: str, args: list) -> tuple:
        impl = graph_runner_for(impl_name)
        if key not in self.warmed:
            versions = [a._version if isinstance(a, torch.Tensor) else None for a in args]
            out = impl.warmup(lambda: self._run(args))
            mutated = [
                i
                for i, (a, v) in enumerate(zip(args, versions))
                if isinstance(a, torch.Tensor) and a._version != v
            ]
            if mutated:
                self._give_up(key, f"it mutates its input(s) at position(s) {mutated} in place")
                return out
            self.warmed.add(key)
            return out  # the warm-up's own results: fresh tensors, nothing to invalidate
        try:
            static_inputs = [self._static_copy(i, a) for i, a in enumerate(args)]
        except RuntimeError as e:  # e.g. an input whose elements overlap (expanded)
            return self._fallback(key, f"an input cannot be copied into a buffer ({e})", args)
        try:
            pool = self.group.pool(impl_name, impl)
            graph, outs = impl.capture(lambda: self._run(static_inputs), pool)
        except Exception as e:  # an op that cannot be captured: run without the graph
            return self._fallback(key, f"capture failed ({type(e).__name__}: {str(e)[:200]})", args)
        why = _replay_differs(impl, graph, outs, lambda: self._run(static_inputs))
        if why:
            return self._fallback(key, why, args)
        rec = _Recorded(graph, static_inputs, outs, Generation(self.group.label), impl_name)
        rec.copied = [
            i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and not self._is_static(i)
        ]
        rec.borrowed = frozenset(i for i in rec.copied if type(args[i]) is GraphOutput)
        self.recorded[key] = rec
        RECORDED[self.group.label] += 1
        return self._replay(key, rec, impl_name, args)

    def _static_copy(self, i: int, a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        if self._is_static(i) or type(a) is GraphOutput:
            # A graph output (a forward's saved value, read by its backward) is read where the
            # other graph writes it: each step's replay of that graph puts the next value there,
            # so this replay needs no copy (a 2-layer MLP's training step made 5 copies, 2 now)
            return a.detach()
        buf = torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device)
        return buf.copy_(a)

    def _replay(self, key: tuple, rec: _Recorded, impl_name: str, args: list) -> tuple:
        dst, src = [], []
        for i in rec.copied:
            a, s = args[i], rec.static_inputs[i]
            if a.data_ptr() != s.data_ptr():
                if i in rec.borrowed:  # never write into another graph's output buffer
                    return self._fallback(
                        None,
                        f"input {i} was recorded in place, as another graph's output, and this "
                        "call passes a different tensor there",
                        args,
                    )
                dst.append(s)
                src.append(a)
        if len(dst) > 1:  # one launch for all (a decode step copies its token ids, position
            torch._foreach_copy_(dst, src)  # and two KV caches)
        elif dst:
            dst[0].copy_(src[0])
        del args, src
        graph_runner_for(impl_name).replay(rec.graph)
        rec.generation.count += 1
        if self.pending_tracking:
            self.pending.add(key)
        if self.clone_outputs:
            return tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in rec.outputs)
        return tuple(
            GraphOutput.wrap(o, rec.generation) if isinstance(o, torch.Tensor) else o
            for o in rec.outputs
        )


def _address_or_type(a: Any) -> Any:
    return a.data_ptr() if isinstance(a, torch.Tensor) else (type(a), a)


def _getter(positions: Sequence[int]) -> Callable[[list], tuple]:
    """`args -> tuple(args[i] for i in positions)`, in C for two or more positions."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    if positions:
        (i,) = positions
        return lambda args: (args[i],)
    return lambda args: ()


def _replay_differs(impl: DeviceGraphs, graph, outs: tuple, run: Callable[[], Any]) -> str:
    """Check a new graph once: its replay must give what plain launches of the same code on
    the same buffers give, bit for bit. Code whose two plain runs already differ (random ops,
    atomics) is not checked. A difference means the capture went wrong somewhere: that
    signature then runs without a graph, with the reason logged, instead of giving wrong
    results."""
    first = [o.clone() for o in _as_tuple(run()) if isinstance(o, torch.Tensor)]
    second = [o for o in _as_tuple(run()) if isinstance(o, torch.Tensor)]
    if not all(torch.equal(a, b) for a, b in zip(first, second)):
        return ""  # not deterministic: nothing to compare a replay with
    impl.replay(graph)
    replayed = [o for o in outs if isinstance(o, torch.Tensor)]
    bad = [i for i, (a, b) in enumerate(zip(replayed, first)) if not torch.equal(a, b)]
    if bad:
        return (
            f"a replay of the captured graph differed from plain launches of the same code "
            f"(output(s) {bad}); this is a kiln bug worth reporting"
        )
    return ""


def graphed(fn: Callable, group: GraphGroup | None = None, **kwargs: Any) -> GraphedCallable:
    """Wrap `fn` in device graphs (a new group unless one is given); see `GraphedCallable`."""
    return GraphedCallable(fn, group or GraphGroup(), **kwargs)


_COMM_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "c10d", "_dtensor")


def device_graph_refusal(gm: torch.fx.GraphModule) -> str | None:
    """Why `gm` must not replay as a device graph, or None. A graph with collective
    communication runs its kernels normally: capturing it needs every rank to capture the same
    collectives at the same time (a replay on one rank against a normal run on another hangs
    both), which kiln's per-process warm-up and capture do not coordinate. DDP's and FSDP's own
    communication never reaches a graph (capture/data_parallel.py: it runs between graphs), so
    `kiln.compile(DDP(model), mode="reduce-overhead")` replays the model's graphs as usual."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if node.target.namespace in _COMM_NAMESPACES:
                return (
                    f"not replayed as a device graph: it communicates ({node.target.name()}); "
                    "capturing collectives needs every rank to capture in lock-step, which "
                    "kiln does not coordinate; its kernels run normally"
                )
    return None


def wrap_compilers(
    fw_compiler: Callable, bw_compiler: Callable, group: GraphGroup
) -> dict[str, Callable]:
    """`aot_compile` keyword arguments whose compiled graphs replay as device graphs.

    A training forward is paired with the backward compiled next to it (aot_compile compiles
    the backward, then its forward) so the backward can release the forward's pending replay;
    either order pairs them."""
    unpaired: list[tuple[str, GraphedCallable, bool]] = []  # (name, graph, backward reads it)

    def refused(gm, compiled: Callable) -> Callable | None:
        reason = device_graph_refusal(gm)
        if reason is None:
            return None
        logs.once(f"dg-refused:{group.label}", "perf_hints", f"{group.label}: {reason}")
        unpaired.clear()  # its partner, if graphed, has no graphed forward or backward to pair
        return compiled

    def pair(name: str, g: GraphedCallable, reads: bool = True) -> None:
        if not unpaired or unpaired[-1][0] == name:
            unpaired[:] = [(name, g, reads)]
            return
        _, other, other_reads = unpaired.pop()
        if name == "forward":
            forward, backward, reads = g, other, other_reads
        else:
            forward, backward = other, g
        backward.backward_of = forward
        if not reads:  # the backward reads nothing of the forward
            forward.pending_tracking = False

    def fw(gm, example_inputs):
        compiled = fw_compiler(gm, example_inputs)
        plain = refused(gm, compiled)
        if plain is not None:
            return plain
        g = GraphedCallable(compiled, group, name="forward", static_inputs=group.static_inputs)
        g.pending_tracking = True
        pair("forward", g)
        return g

    def bw(gm, example_inputs):
        compiled = bw_compiler(gm, example_inputs)
        plain = refused(gm, compiled)
        if plain is not None:
            return plain
        g = GraphedCallable(compiled, group, name="backward", clone_outputs=True)
        saved = [n for n in gm.graph.find_nodes(op="placeholder") if "tangent" not in n.name]
        pair("backward", g, bool(saved))
        return g

    def inference(gm, example_inputs):
        compiled = fw_compiler(gm, example_inputs)
        plain = refused(gm, compiled)
        if plain is not None:
            return plain
        return GraphedCallable(compiled, group, name="inference", static_inputs=group.static_inputs)

    return {"fw_compiler": fw, "bw_compiler": bw, "inference_compiler": inference}
