"""The compiled callable: its cache of entries, tracing on a miss, recompiles and limits.

Takes the user's function, bound method or module and the frozen options; gives a callable.
A call runs the first cache entry whose guards hold. On a miss it traces the call (the trace
*is* the call: its result is returned), hands the graph to the backend, and adds an entry.
Past `cache_size_limit` entries, or when a frame cannot be captured, the callable runs
eagerly and says why once. A callable that reached the limit, or whose continuation (the rest
of a call after a graph break) gave up, runs natively from then on: one attribute test per
call, no guard checks, no kiln interpreter (a continuation has no native code of its own, so a
given-up continuation would otherwise run the rest of every call in kiln's interpreter).
"""

from __future__ import annotations

import inspect
import threading
import types
import weakref
from typing import Any, Callable

import torch
import torch.fx as fx

from .. import logs, trace
from ..contracts import Backend, CaptureInfo
from ..gc_pause import paused_gc, saved_tensor_hooks_suspended
from ..lazy_graphs import LazyGraphModule
from . import (
    breaks,  # noqa: E402  (needs CompiledFunction defined at call time only)
    calls,
    capture_cache,
    eager_notice,
    module_tree,
    numpy_trace,
    user_traceback,
)
from .continuations import GraphBreakAt, build_frames, resume_chain
from .errors import AbortTrace, FullgraphBreak, Unsupported
from .guards import GuardSet
from .interpreter import Interpreter
from .residual import (
    MISS,
    NotRebuildable,
    Rebuilder,
    build_entry,
    side_effect_lines,
    signature_text,
)
from .sources import ConstSource, LocalSource, Namer
from .symbolic import unwrap
from .tracer import Tracer

_state = threading.local()
_all_compiled: "weakref.WeakSet[CompiledFunction]" = weakref.WeakSet()


_explaining: list = []  # while `kiln explain` runs a script: every compiled callable, kept alive


def is_tracing() -> bool:
    return getattr(_state, "depth", 0) > 0


class CompiledFunction:
    # opens the store of kept captures (capture_cache.py), or gives None; set by kiln.compile
    # (api.py: the compiled-artifact store, which capture may not import)
    capture_store: Callable[[], Any] | None = None

    def __init__(
        self,
        root_callable: Callable,
        signature_of: Callable | None,
        opts,
        label: str,
        root_globals: dict,
        signature: inspect.Signature | None = None,
        backend: Backend | None = None,
    ) -> None:
        if backend is None:
            raise TypeError("CompiledFunction needs the backend kiln.compile bound (backend=)")
        self.root_callable = root_callable
        self.opts = opts
        self.backend = backend
        self.label = label
        self.root_globals = root_globals
        self.entries: list[Callable] = []
        self.entry_sources: list[str] = []
        self.entry_guards: list[tuple] = []
        self.eager_reason: str | None = None
        # set when this callable gave up for good: every call runs `root_callable` natively
        # without looking at the entries (see `run_natively`)
        self.native_only = False
        self.compiles = 0
        self.breaks: list[tuple[str, str, str]] = []  # (reason, where, hint), for explain
        self.graph_modules: list[fx.GraphModule] = []  # every graph this callable compiled
        self.seen_shapes: dict[str, tuple] = {}  # input source -> sizes at the last trace
        self.auto_dynamic: dict[str, set[int]] = {}  # dims seen to change (dynamic=None)
        self.seen_floats: dict[str, float] = {}  # dict item source -> float at the last trace
        self.dynamic_floats: set[str] = set()  # those seen to change (dynamic_floats.py)
        self.continuations: dict = {}
        self.nested: list[CompiledFunction] = []  # modules compiled apart (data_parallel.py)
        self.splits: list[str] = []  # where eager bookkeeping surrounds them, for explain
        self.cache_looked = False  # the kept capture was looked for (once, on the first miss)
        try:
            # the parameters of the code that runs: a `functools.wraps` wrapper (an LR
            # scheduler's `optimizer.step`) takes `*args, **kwargs`, whatever it wraps
            sig = signature or inspect.signature(signature_of, follow_wrapped=False)
        except (TypeError, ValueError):
            sig = inspect.Signature(
                [
                    inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                    inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
                ]
            )
        self.signature = sig
        self.params, self.forward_call, self.defaults, self.kwdefaults = signature_text(sig)
        _all_compiled.add(self)
        if _explaining:
            _explaining.append(self)

    @classmethod
    def for_callable(cls, fn: Callable, opts, backend: Backend) -> "CompiledFunction":
        target = fn.__func__ if isinstance(fn, types.MethodType) else fn
        g = getattr(target, "__globals__", None) or {}
        return cls(fn, fn, opts, getattr(fn, "__qualname__", repr(fn)), g, backend=backend)

    @classmethod
    def for_module(cls, mod: torch.nn.Module, opts, backend: Backend) -> "CompiledFunction":
        fwd = type(mod).forward
        return cls(
            mod,
            mod.forward,
            opts,
            f"{type(mod).__qualname__}.forward",
            getattr(fwd, "__globals__", {}),
            backend=backend,
        )

    # ---- calls --------------------------------------------------------------------------------
    def __call__(self, /, *args, **kwargs):
        # `self` is positional-only: a user keyword named `self` belongs to `kwargs`
        try:
            if self.native_only or is_tracing():  # given up, or reached natively from inside
                return self.root_callable(*args, **kwargs)  # another trace: just run it
            for entry in self.entries:
                result = entry(*args, **kwargs)
                if result is not MISS:
                    return result
            return self._miss(args, kwargs)
        except Exception as exc:  # the user's own error: give it the user's traceback
            tb = user_traceback.rewrite(exc)
            if tb is None:
                raise
            raise exc.with_traceback(tb)  # noqa: B904  (the same exception, re-raised)

    def _miss(self, args: tuple, kwargs: dict):
        """No entry's guards held: run eagerly, give up at the entry limit, or trace."""
        if self.eager_reason is not None:
            return self.run_eagerly(args, kwargs)
        if len(self.entries) >= self.opts.cache_size_limit:
            failures = self._why_missed(args, kwargs)
            if self.opts.fullgraph:
                raise Unsupported(
                    f"{self.label}: {len(self.entries)} compiled entries (cache_size_limit) "
                    f"and the guards still failed, under fullgraph=True. The guards that failed: "
                    f"{failures}. Mark the changing sizes dynamic, or raise the limit with "
                    "options={'cache_size_limit': N}."
                )
            self.eager_reason = "cache size limit"
            logs.log("fallbacks", f"{self.label}: cache_size_limit reached; {failures}")
            eager_notice.warn_recompile_limit(self, len(self.entries), failures)
            self.run_natively()
            return self.run_eagerly(args, kwargs)
        if self.entries and logs.is_on("recompiles"):
            logs.log(
                "recompiles",
                lambda: f"recompiling {self.label}: {self._why_missed(args, kwargs)}",
            )
        if self.opts.get("trace.enabled"):  # the compile as one frame of the trace (kiln/trace)
            missed = self._why_missed(args, kwargs) if self.entries else None
            return trace.compile_frame(
                self, self.opts.get("trace.dir"), missed, lambda: self._trace(args, kwargs)
            )
        if not self.cache_looked and not self.entries:
            self.cache_looked = True
            result = self._from_capture_cache(args, kwargs)
            if result is not MISS:
                return result
        return self._trace(args, kwargs)

    def _store(self):
        """The store of kept captures for this callable, or None (a continuation, a nested
        module, `kiln explain`, logs that show capture's products, or the cache off)."""
        if self.capture_store is None or type(self) is not CompiledFunction or _explaining:
            return None
        return self.capture_store()

    def _from_capture_cache(self, args: tuple, kwargs: dict):
        """The first call of a new process: the entry a former process kept for this frame,
        if every object it holds is found again and every guard holds (capture_cache.py);
        MISS otherwise (this call is captured as usual)."""
        if any(logs.is_on(a) for a in ("graph", "bytecode", "guards", "graph_breaks")):
            return MISS  # they show capture's products: capture
        store = self._store()
        loaded = capture_cache.load(self, store) if store is not None else None
        if loaded is None:
            return MISS
        try:
            self._install_loaded(loaded)
        except Exception as e:  # noqa: BLE001 - anything unexpected: capture as usual
            capture_cache.STATS["misses"] += 1
            capture_cache.say(f"{self.label}: kept capture not used: {type(e).__name__}: {e}")
            return MISS
        entry = self.entries[-1]
        try:
            result = entry(*args, **kwargs)
        except capture_cache.BindFailed as e:
            result, why = MISS, f"its graph did not compile: {e}"
        else:
            why = "" if result is not MISS else self._why_missed(args, kwargs)
        if result is MISS:
            self.reset()
            self.cache_looked = True
            capture_cache.STATS["misses"] += 1
            capture_cache.say(f"{self.label}: kept capture not used: {why}")
            return MISS
        capture_cache.STATS["hits"] += 1
        capture_cache.say(f"{self.label}: capture loaded from the cache")
        return result

    def _install_loaded(self, loaded) -> None:
        """Add the entry `loaded` describes, written as `_install` writes a traced one."""
        namer = Namer()
        for name, obj in loaded.result_names:  # the names the result code uses, as they were
            namer.seed(name, obj)
        effects = [
            f"setattr({src.expr(namer)}, {name!r}, {value!r})"
            if op == "set"
            else f"if hasattr({src.expr(namer)}, {name!r}): delattr({src.expr(namer)}, {name!r})"
            for op, src, name, value in loaded.effects
        ]
        guards = [g for g in loaded.guards if g is not None]
        if len(guards) < len(loaded.guards):  # the module-structure guard, for this process
            module_tree.install()
            for m in loaded.modules:
                module_tree.watch(m)
            guards.append(capture_cache.tree_guard())
        inputs = _input_exprs([(src, None, None) for src in loaded.inputs], namer)
        has_graph = loaded.graph is not None
        if has_graph:
            namer.bind("___graph", capture_cache.Binder(self, loaded))
        guard_set = GuardSet()
        for g in guards:
            guard_set.add(g)
        checks = guard_set.check_lines(namer)
        name = f"___entry_{len(self.entries)}"
        entry, source = build_entry(
            self.params,
            self.defaults,
            self.kwdefaults,
            checks,
            [namer.bound.get(e, e) for e in inputs],
            has_graph,
            loaded.lets + effects,
            loaded.result_expr,
            namer,
            name,
            None,
        )
        if has_graph:
            namer.namespace["___graph"].scope = entry.__globals__
        logs.log("bytecode", lambda: f"residual of {self.label} (kept capture):\n{source}")
        self.entries.append(entry)
        self.entry_sources.append(source)
        self.entry_guards.append((guard_set.guards, namer))

    def _compile_nested(self, fn) -> "CompiledFunction":
        """A module (or a module's bound forward) the trace runs its own way
        (data_parallel.py), compiled with this function's settings; `kiln.explain` of this
        function reports it too."""
        if isinstance(fn, torch.nn.Module):
            compiled = CompiledFunction.for_module(fn, self.opts, self.backend)
        else:
            compiled = CompiledFunction.for_callable(fn, self.opts, self.backend)
        getattr(self, "root_cf", self).nested.append(compiled)
        return compiled

    def _why_missed(self, args, kwargs) -> str:
        from .guards import explain_failure

        reasons = []
        for guards, namer in self.entry_guards:
            reasons.append(
                explain_failure(
                    guards, namer, self.params, args, kwargs, self.defaults, self.kwdefaults
                )
                or "?"
            )
        return "; ".join(reasons) if reasons else "no entries"

    # ---- tracing ------------------------------------------------------------------------------
    def _trace(self, args: tuple, kwargs: dict):
        """Trace a call (the trace is the call) and give its result, with no symbolic number
        left in it or in what it stored outside (see symbolic.unwrap)."""
        made: list[Tracer] = []
        result = self._trace_call(args, kwargs, made)
        if made:
            settle_effects(made[0])
            made[0].release()  # the call's real values die now, not at the next collection
        return unwrap(result)

    def _trace_call(self, args: tuple, kwargs: dict, made: list):
        interp_holder: list[Interpreter] = []
        tracer = Tracer(self.opts, lambda: interp_holder[0].location())
        made.append(tracer)
        interp = Interpreter(tracer, self.root_globals)
        interp_holder.append(interp)
        tracer.interp = interp
        tracer.dynamic_policy = self._dynamic_dims
        tracer.float_slots.policy = self._dynamic_float
        tracer.compile_module = (self._compile_nested, (id(self.opts), id(self.backend)))
        _state.depth = getattr(_state, "depth", 0) + 1
        brk = None
        try:
            # module_tree.suspended(): modules built in the trace are its own
            # saved-tensor hooks (a checkpoint around this call) are lifted: the traced call's
            # eager saves could not match a recompute by the compiled graph (gc_pause.py)
            with tracer.mode, module_tree.suspended(), paused_gc(), saved_tensor_hooks_suspended():
                result = self._run_root(tracer, interp, args, kwargs)
        except GraphBreakAt as e:
            brk = e  # handled below, outside this handler: the user's exceptions raised in
            # the rest of the call must not show kiln's break as their context
        except FullgraphBreak as e:
            raise Unsupported(f"{self.label}: {e.message}") from None
        except AbortTrace as e:
            if self.opts.fullgraph:
                raise Unsupported(
                    f"{self.label}: cannot capture as one graph under fullgraph=True\n"
                    f"  at {e.where or '<unknown>'}\n  reason: {e.reason}"
                    + (f"\n  hint: {e.hint}" if e.hint else "")
                ) from None
            self._give_up(e.reason, tracer, e.where, e.hint)
            if tracer.effects_visible or not tracer.context_vars.undo():
                raise RuntimeError(
                    f"kiln: could not finish tracing {self.label} ({e.reason}) after it had "
                    "changed state outside the function; please report this. Run it with "
                    "kiln.disable for now."
                ) from None
            return self.run_eagerly(args, kwargs)
        finally:
            _state.depth -= 1
        if brk is not None:
            return breaks.handle(self, tracer, brk)
        if tracer.broken is not None:
            b = tracer.broken
            self._give_up(f"graph break: {b.reason}", tracer, b.where, b.hint)
            return result
        try:
            self._install(tracer, result)
        except NotRebuildable as e:
            if self.opts.fullgraph:
                raise Unsupported(f"{self.label}: cannot rebuild the result: {e}") from None
            self._give_up(f"cannot rebuild the result on later calls: {e}", tracer)
        return result

    def _run_root(self, tracer: Tracer, interp: Interpreter, args: tuple, kwargs: dict):
        """Track the arguments and run the compiled callable on kiln's interpreter."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        for name, value in bound.arguments.items():
            tracer.track(value, LocalSource(name))
        root = self.root_callable
        if isinstance(root, torch.nn.Module):
            tracer.sources[id(root)] = (root, ConstSource(root, "self"))
            interp.root_resumable = not _has_hooks(root)
        else:
            if isinstance(root, types.MethodType):
                tracer.track(root.__self__, ConstSource(root.__self__, "self"))
            interp.root_resumable = True
        return calls.interp_call(interp, root, args, kwargs)

    def _dynamic_dims(self, source, t: torch.Tensor) -> set[int]:
        """Which dimensions of an input tensor are symbolic in this trace (torch.compile's rules).

        `kiln.mark_dynamic`/`maybe_mark_dynamic` dims always (even under dynamic=False, as
        torch.compile does). Then dynamic=False: no other. dynamic=True: every other dim but
        those `kiln.mark_static` names. dynamic=None (automatic): those whose size differed
        from the previous trace's (they stay dynamic from then on), but not those marked
        static, which get an entry per size. Parameters and buffers (held sources) are always
        static."""
        if isinstance(source, ConstSource):
            return set()
        marked = set(getattr(t, "_kiln_dynamic_dims", ()))
        static = set(getattr(t, "_kiln_static_dims", ())) - marked
        key = source.describe()
        if self.opts.dynamic is False:
            dims = set()
        elif self.opts.dynamic is True:
            dims = set(range(t.dim()))
        else:
            prev = self.seen_shapes.get(key)
            if prev is not None and len(prev) == t.dim():
                changed = {d for d in range(t.dim()) if prev[d] != t.size(d)}
                if changed:
                    self.auto_dynamic.setdefault(key, set()).update(changed)
            dims = set(self.auto_dynamic.get(key, set()))
        self.seen_shapes[key] = tuple(t.shape)
        return (dims - static) | marked

    def _dynamic_float(self, source, value: float) -> bool:
        """Whether a float item of a dict is a graph input in this trace: once its value at
        that source differed between two traces (a learning rate a scheduler sets), unless
        dynamic=False."""
        if self.opts.dynamic is False:
            return False
        key = source.describe()
        prev = self.seen_floats.get(key)
        self.seen_floats[key] = value
        if prev is not None and prev != value:
            self.dynamic_floats.add(key)
        return key in self.dynamic_floats

    def _give_up(self, reason: str, tracer, where: str = "", hint: str = "") -> None:
        """Run this callable eagerly from now on, and say why (once per code object)."""
        self.eager_reason = reason + (f"\n  at {where}" if where else "")
        if hint:
            self.eager_reason += f"\n  hint: {hint}"
        logs.log("graph_breaks", f"{self.label}: {self.eager_reason}")
        logs.log("fallbacks", f"{self.label} runs eagerly: {reason.splitlines()[0]}")
        eager_notice.warn_eager(self, reason, where, hint)

    def run_eagerly(self, args: tuple, kwargs: dict):
        return self.root_callable(*args, **kwargs)

    def run_natively(self) -> None:
        """From the next call on, run the function as written, natively: past the entry limit
        no new entry is made, and the old ones (traced for other sizes or values, which is why
        the limit was reached) are not consulted either, so a given-up call costs one test."""
        self.native_only = True

    def _install(self, tracer: Tracer, result: Any, tail=None) -> None:
        """Compile the trace's graph and add a cache entry. `tail(rb)` may replace the final
        `return` with lines of its own (a graph break's step and continuation call)."""
        tracer.example_values()
        namer = Namer()
        rb = Rebuilder(tracer, namer)
        effects = side_effect_lines(tracer, rb)
        store = self._store()
        saver = capture_cache.Saver(self, tracer) if store is not None else None
        if saver is not None:
            saver.refuse_if(bool(rb.lets), "it has side effects to replay")
            saver.effects()
        if tail is None:
            result_expr, tail_lines = rb.expr(result), None
        else:
            result_expr, tail_lines = "None", tail(rb)
        if saver is not None:
            saver.result(tail, dict(namer.namespace), result_expr, rb.lets)
        effects = rb.lets + effects
        graph = tracer.graph
        has_compute = any(
            n.op in ("call_function", "call_method", "call_module") for n in graph.nodes
        )
        inputs = _input_exprs(tracer.placeholders, namer)
        compiled = None
        if has_compute:
            graph.output(tuple(rb.outputs))
            if saver is not None:
                saver.graph(graph, tracer.constants)
            with module_tree.suspended():
                root = torch.nn.Module()
                for name, t in tracer.constants.items():
                    setattr(root, name, t)
                gm = LazyGraphModule(root, graph, class_name="KilnGraph")
            self.graph_modules.append(gm)
            logs.log("graph", lambda: f"graph of {self.label}:\n{gm.print_readable(False)}")
            example_inputs = [t for _, t, _ in tracer.placeholders]
            info = CaptureInfo(
                label=self.label,
                options=self.opts,
                static_inputs=_held_positions(tracer, example_inputs),
                checked_inputs=tuple(
                    i
                    for i, (_, _, n) in enumerate(tracer.placeholders)
                    if n.meta.get("kiln_layout_guarded")
                ),
                # every tensor input has a tensor guard (requires_grad included) and the grad
                # mode is always guarded: with no other inputs, AOT's per-call key is fixed
                fixed_call_key=all(isinstance(t, torch.Tensor) for t in example_inputs),
            )
            self.compiles += 1
            with paused_gc():
                compiled = self.backend(gm, example_inputs, info)
            if not callable(compiled):
                raise TypeError(
                    f"backend {self.backend.name!r} returned {compiled!r}, which is not callable"
                )
            # a backend may say how it ran the graph (split at DDP's buckets): kiln.explain
            getattr(self, "root_cf", self).splits.extend(getattr(compiled, "explain_notes", ()))
            compiled = _first_call(compiled, gm)
            namer.bind("___graph", compiled)
        if tracer.dyn is not None:
            # read after the backend ran: the shape facts AOT autograd's trace added to the
            # shape environment are guarded with capture's (as torch.compile's backends' are)
            for g in tracer.dyn.guards():
                tracer.guards.add(g)
        name = f"___entry_{len(self.entries)}"
        checks = tracer.guards.check_lines(namer)
        entry, source = build_entry(
            self.params,
            self.defaults,
            self.kwdefaults,
            checks,
            [namer.bound.get(e, e) for e in inputs],  # values the checks read already
            compiled is not None,
            effects,
            result_expr,
            namer,
            name,
            tail_lines,
        )
        logs.log(
            "guards",
            lambda: (
                f"guards of {self.label} entry {len(self.entries)}:\n{tracer.guards.describe()}"
            ),
        )
        if isinstance(compiled, _ResolveOnFirstCall):
            compiled.scope = entry.__globals__
        if saver is not None:
            saver.finish(list(tracer.guards.guards), info if compiled is not None else None, store)
        logs.log("bytecode", lambda: f"residual of {self.label}:\n{source}")
        self.entries.append(entry)
        self.entry_sources.append(source)
        self.entry_guards.append((list(tracer.guards.guards), namer))

    def continuation(self, key, specs, nvalues: int) -> "Continuation":
        """The continuation at `specs` (a graph break's rest of the call), made on first use
        and kept like a frame's compiled entries."""
        cont = self.continuations.get(key)
        if cont is None:
            cont = self.continuations[key] = Continuation(self, specs, nvalues)
        return cont

    def reset(self) -> None:
        self.continuations.clear()
        self.breaks.clear()
        self.entries.clear()
        self.entry_sources.clear()
        self.entry_guards.clear()
        self.eager_reason = None
        self.native_only = False


def settle_effects(tracer: Tracer) -> None:
    """The trace stored values into outside objects as it ran: put plain numbers where it
    stored symbolic ones (later calls replay plain values: the graph's outputs)."""
    for eff in tracer.side_effects.effects:
        if eff.kind == "attr":
            value = getattr(eff.target, eff.name, _ABSENT)
            if value is not _ABSENT:
                plain = unwrap(value)
                if plain is not value:
                    setattr(eff.target, eff.name, plain)
        elif eff.kind == "container":
            unwrap(eff.target)
        elif eff.kind == "global" and eff.name in eff.target:
            eff.target[eff.name] = unwrap(eff.target[eff.name])
        elif eff.kind == "cell":
            try:
                eff.target.cell_contents = unwrap(eff.target.cell_contents)
            except ValueError:  # emptied
                pass


_ABSENT = object()


class Continuation(CompiledFunction):
    """The rest of a compiled function after a graph break, as a compiled callable of the
    frames' live values (breaks.py makes them through `CompiledFunction.continuation`)."""

    def __init__(self, root: CompiledFunction, specs, nvalues: int) -> None:
        params = [
            inspect.Parameter(f"___v{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(nvalues)
        ]
        inner = specs[-1]
        line = inner.fn.__code__.co_firstlineno
        label = f"{root.label} [resume in {inner.fn.__qualname__}@{line} pc {inner.pc}]"
        super().__init__(
            None,
            None,
            root.opts,
            label,
            root.root_globals,
            signature=inspect.Signature(params),
            backend=root.backend,
        )
        self.root_cf = root
        self.specs = specs
        self.result_slot = nvalues - 1 if specs[-1].stack_nulls[-1:] == (False,) else -1
        # live values that held symbolic sizes in a trace that broke here (they arrive as
        # plain numbers: the symbols belonged to that trace's graph)
        self.sized_slots: set[int] = set()

    def _run_root(self, tracer, interp, args, kwargs):
        values = list(args)
        for i, v in enumerate(values):
            src = LocalSource(f"___v{i}")
            if i in self.sized_slots:  # sizes symbolic before the break: symbols here
                values[i] = tracer.symbolic_value(v, src, sized=True)
            elif i == self.result_slot and type(v).__module__ != "numpy":
                values[i] = tracer.symbolic_value(v, src)  # t.item(), t.tolist(): by use
            elif type(v).__module__ == "numpy" and numpy_trace.lift_input(tracer, v, src):
                pass  # an array or NumPy scalar: a graph input, traced (numpy_trace.py)
            else:
                tracer.track(v, src)
        frames = build_frames(tracer, self.specs, values)
        interp.root_frame = frames[0]
        interp.root_resumable = True
        return resume_chain(interp, frames)

    def _give_up(self, reason: str, tracer, where: str = "", hint: str = "") -> None:
        super()._give_up(reason, tracer, where, hint)
        self.run_natively()

    def run_natively(self) -> None:
        """A continuation has no native code: only kiln's interpreter can run the rest of a
        call from the middle of a frame (35 times slower than eager on a small decoder). Once
        it gives up, the function it belongs to runs natively from its next call on; this call
        finishes in the interpreter."""
        self.root_cf.eager_reason = self.root_cf.eager_reason or (
            f"the rest of the call after a graph break runs eagerly ({self.label}: "
            f"{(self.eager_reason or 'cache size limit').splitlines()[0]})"
        )
        self.root_cf.run_natively()

    def run_eagerly(self, args: tuple, kwargs: dict):
        interp = breaks.concrete_interpreter(self)
        return resume_chain(interp, build_frames(interp.tracer, self.specs, list(args)))


def _held_positions(tracer: Tracer, inputs: list) -> tuple[int, ...]:
    """Positions of the graph inputs that are parameters or buffers of the modules the trace
    read: state that lives at one address from call to call, which device graphs read in
    place."""
    modules = [obj for obj, _ in tracer.sources.values() if isinstance(obj, torch.nn.Module)]
    buffers = {id(b) for m in modules for b in m._buffers.values() if b is not None}
    return tuple(
        i
        for i, t in enumerate(inputs)
        if isinstance(t, torch.nn.Parameter) or (isinstance(t, torch.Tensor) and id(t) in buffers)
    )


def _input_exprs(placeholders, namer: Namer) -> list[str]:
    """How the entry fetches each graph input. A run of held objects (parameters and buffers,
    fixed under the module-structure guard) is one held tuple, unpacked: less code to compile
    and faster to call than a name per parameter."""
    out: list[str] = []
    run: list = []
    for src, _, _ in [*placeholders, (None, None, None)]:
        if isinstance(src, ConstSource):
            run.append(src.obj)
            continue
        if len(run) > 2:
            out.append("*" + namer.const(tuple(run), "held"))
        else:
            out += [namer.const(obj, "self") for obj in run]
        run = []
        if src is not None:
            out.append(src.expr(namer))
    return out


class _ResolveOnFirstCall:
    """The backend returned the graph module's own `forward` and the module writes its code
    lazily (nothing needs it on the call that was traced): the first later call generates it
    and puts the real `forward` in the entry's namespace, so calls after that go straight to
    it."""

    def __init__(self, gm) -> None:
        self.gm = gm
        self.scope: dict | None = None

    def __call__(self, *args):
        self.gm.real_recompile()
        forward = self.gm.forward
        if self.scope is not None:
            self.scope["___graph"] = forward
        return forward(*args)


def _first_call(compiled, gm):
    lazy = getattr(type(gm), "_lazy_forward", None)
    if lazy is not None and getattr(compiled, "__func__", None) is lazy:
        if compiled.__self__ is gm:
            return _ResolveOnFirstCall(gm)
    return compiled


def _has_hooks(mod: torch.nn.Module) -> bool:
    g = torch.nn.modules.module
    return bool(
        mod._forward_hooks
        or mod._forward_pre_hooks
        or g._global_forward_hooks
        or g._global_forward_pre_hooks
    )


def mark_disabled(fn):
    return calls.mark_disabled(fn)


def mark_allow_in_graph(fn):
    return calls.mark_allow_in_graph(fn)


def reset_all() -> None:
    for c in list(_all_compiled):
        c.reset()
    eager_notice.forget()
