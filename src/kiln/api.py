"""`kiln.compile` and its companions: the public surface that mirrors `torch.compile`.

Takes a function, bound method or `nn.Module` plus torch.compile's keyword arguments; gives a
callable (or module) that runs through kiln's capture (capture/frontend.py) and the chosen
backend. Argument errors are raised here, before anything runs, and name the valid choices.
"""

from __future__ import annotations

import functools
import inspect
import sys
import warnings
from typing import Any, Callable

import torch

from . import logs
from .backends import (
    builtin,  # noqa: F401  (registers eager / aot_eager / inductor)
    ddp_split,
)
from .backends.registry import known_backend_names, lookup_backend
from .capture import data_parallel, frontend
from .capture.bytecode import UNSUPPORTED as UNSUPPORTED_PYTHON
from .contracts import Backend
from .options import Options, build_options


def compile(
    model: Callable | None = None,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    backend: str | Callable = "inductor",
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    disable: bool = False,
):
    """Compile `model` (a function, method or nn.Module) with kiln; torch.compile's signature."""
    opts = build_options(
        backend=backend,
        mode=mode,
        fullgraph=fullgraph,
        dynamic=dynamic,
        options=options,
        known_backends=known_backend_names(),
    )
    for key, message in opts.notices:  # accepted values kiln cannot honour yet: said once
        logs.warn_once(key, message)
    if model is None:
        return lambda fn: _compile_one(fn, opts, disable)
    return _compile_one(model, opts, disable)


def _compile_one(model: Callable, opts: Options, disable: bool):
    if not callable(model):
        raise TypeError(
            f"kiln.compile: expected a function, method or nn.Module, got "
            f"{type(model).__name__} ({model!r:.60}). Pass the callable itself, e.g. "
            "kiln.compile(model) or kiln.compile(fn)."
        )
    if disable:
        return model
    if UNSUPPORTED_PYTHON is not None:
        return _unsupported_python(model, opts)
    if inspect.iscoroutinefunction(model) or inspect.isasyncgenfunction(model):
        raise TypeError(
            f"kiln.compile: {getattr(model, '__qualname__', model)!r} is async; kiln compiles "
            "synchronous code only. Compile the synchronous functions it calls instead."
        )
    # a graph captured inside a DDP forward is split at its bucket boundaries (ddp_split.py)
    backend = ddp_split.ddp_aware(Backend.bind(opts.backend, lookup_backend(opts.backend)))
    if isinstance(model, torch.nn.Module):
        if data_parallel.is_data_parallel(model):
            return _data_parallel_module(model, opts, backend)
        return OptimizedModule(
            model, _shape_handled(frontend.CompiledFunction.for_module(model, opts, backend), opts)
        )
    compiled = _shape_handled(frontend.CompiledFunction.for_callable(model, opts, backend), opts)

    @functools.wraps(model)
    def compiled_fn(*args, **kwargs):
        return compiled(*args, **kwargs)

    compiled_fn._kiln_compiled = compiled  # type: ignore[attr-defined]
    compiled_fn._torchdynamo_orig_callable = model  # type: ignore[attr-defined]
    return compiled_fn


def _capture_store():
    """The store a compiled callable keeps its capture in for later processes
    (capture/capture_cache.py): the compiled-artifact store, or None when that cache is off
    (`KILN_ARTIFACT_CACHE=0`) or cannot be used."""
    from .options import env_artifact_cache
    from .runtime.artifacts import open_store

    return open_store() if env_artifact_cache() else None


frontend.CompiledFunction.capture_store = staticmethod(_capture_store)  # type: ignore[assignment]


def _data_parallel_module(ddp: torch.nn.Module, opts: Options, backend: Backend):
    """`kiln.compile(DDP(model))`: DDP's forward stays eager, `model` is compiled
    (capture/data_parallel.py says why and what that means for DDP's options)."""
    inner = frontend.CompiledFunction.for_module(ddp.module, opts, backend)
    inner.capture_store = None  # its trace runs in DDP's bookkeeping: not kept
    note = data_parallel.note(ddp)
    inner.splits.append(note)
    logs.log("graph_breaks", f"kiln.compile(DistributedDataParallel): {note}")
    return OptimizedModule(ddp, inner, call=data_parallel.DataParallelCall(ddp, inner))


def _hooks_outside(wrapper: OptimizedModule):
    """The original is managed by a composable API (fully_shard, replicate): its hooks
    communicate and run eagerly (capture/data_parallel.py); its forward is compiled alone."""
    d = wrapper.__dict__
    mod, whole = d["_orig_mod"], d["_kiln_compiled"]
    forward = frontend.CompiledFunction.for_callable(mod.forward, whole.opts, whole.backend)
    forward.capture_store = None  # its trace runs among the hooks' bookkeeping: not kept
    note = data_parallel.hooks_note(mod)
    forward.splits.append(note)
    logs.log("graph_breaks", f"kiln.compile({type(mod).__qualname__}): {note}")
    d["_kiln_compiled"] = forward
    call = d["_kiln_call"] = data_parallel.HooksOutsideCall(mod, forward)
    return call


def _shape_handled(compiled, opts: Options):
    """The compiled callable, padding inputs to gears and slicing outputs back when
    `options={"enable_shape_handling": True, ...}` asks (runtime/shape_handling.py); the
    configs are checked here, at compile time."""
    if not opts.get("enable_shape_handling"):
        return compiled
    from .runtime.shape_handling import ShapeHandled, parse_configs

    return ShapeHandled(compiled, parse_configs(opts.get("shape_handling_configs")))


_warned_unsupported = False


def _unsupported_python(model: Callable, opts: Options):
    """A Python kiln's interpreter does not know: run eagerly, and say so once per process;
    fullgraph=True asked for one graph, so it is an error."""
    global _warned_unsupported
    from .capture.errors import Unsupported

    if opts.fullgraph:
        raise Unsupported(f"kiln.compile(fullgraph=True): {UNSUPPORTED_PYTHON}")
    if not _warned_unsupported:
        _warned_unsupported = True
        warnings.warn(UNSUPPORTED_PYTHON, RuntimeWarning, stacklevel=4)
    return model


class OptimizedModule(torch.nn.Module):
    """A compiled module that is the original in every way but its `forward`.

    Parameters, buffers, submodules and state-dict hooks are the original's own dictionaries,
    so `parameters()`, `state_dict()` (same keys, no prefix), `train()`/`eval()` and `.to()`
    act on the original module. In the module tree the wrapper stands where the user put it
    (`modules()` yields it, then the original at the same name, then the original's
    submodules): PyTorch's composable APIs (`fully_shard`, `checkpoint_wrapper`, forward
    hooks) attach their state and hooks to the wrapper, which runs them eagerly around the
    compiled `original.__call__` (whose own hooks are compiled with it).
    """

    def __init__(
        self,
        mod: torch.nn.Module,
        compiled: frontend.CompiledFunction,
        call: Callable | None = None,
    ):
        super().__init__()
        d = self.__dict__
        d["_orig_mod"] = mod
        d["_kiln_compiled"] = compiled  # what kiln.explain reports
        d["_kiln_call"] = call or compiled  # what forward runs
        for name in _SHARED_DICTS:
            d[name] = mod.__dict__[name]
        _share_composable_state(mod, self)

    @property
    def training(self) -> bool:  # type: ignore[override]
        return self.__dict__["_orig_mod"].training

    @training.setter
    def training(self, value: bool) -> None:
        mod = self.__dict__.get("_orig_mod")
        if mod is not None:
            mod.training = value

    @property
    def _version(self) -> int:  # type: ignore[override]
        # state_dict metadata: the original's format version (BatchNorm's is 2)
        return getattr(self.__dict__["_orig_mod"], "_version", 1)

    def forward(self, *args, **kwargs):
        d = self.__dict__
        call = d["_kiln_call"]
        if call is d["_kiln_compiled"] and data_parallel.composable_state(d["_orig_mod"]):
            call = _hooks_outside(self)  # sharded after it was compiled: from now on
        return call(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        d = self.__dict__
        if not (
            d["_forward_pre_hooks"]
            or d["_forward_hooks"]
            or d["_backward_hooks"]
            or d["_backward_pre_hooks"]
        ):
            # No hook on the wrapper itself: the compiled `original.__call__` runs the
            # original's hooks and the global ones (register_module_forward_hook) once, for
            # the original, as an uncompiled call would
            return self.forward(*args, **kwargs)
        if _global_hooks():
            logs.warn_once(
                "optimized-module-global-hooks",
                "kiln: a compiled module with hooks of its own (fully_shard, "
                "checkpoint_wrapper, register_forward_hook on the compiled module) runs the "
                "global module hooks (register_module_forward_hook) twice: once for the "
                "compiled wrapper, once for the original module inside it",
            )
        return super().__call__(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_orig_mod"], name)

    def train(self, mode: bool = True):
        self._orig_mod.train(mode)
        return self

    # state_dict()/load_state_dict() are Module's own, on the shared dictionaries, so hooks
    # on the wrapper and on the original both run; the original's class decides how its own
    # tensors are saved and loaded (BatchNorm's version handling, get_extra_state)
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        self._orig_mod._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self._orig_mod._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        if memo is None:
            memo = set()
        if remove_duplicate:
            if self in memo:
                return
            memo.add(self)
        yield prefix, self
        yield from self._orig_mod.named_modules(memo, prefix, remove_duplicate)

    def _apply(self, fn, recurse=True):
        self._orig_mod._apply(fn, recurse)
        return self

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"

    # Container protocol of the original: `len()`, `bool()`, iteration, indexing and `in` of
    # a compiled ModuleList/Sequential/ModuleDict answer as the original's do (a plain module
    # has none of them, and raises the original's TypeError).
    def __bool__(self) -> bool:
        return bool(self.__dict__["_orig_mod"])

    def __len__(self) -> int:
        return len(self.__dict__["_orig_mod"])

    def __iter__(self):
        return iter(self.__dict__["_orig_mod"])

    def __getitem__(self, index):
        return self.__dict__["_orig_mod"][index]

    def __contains__(self, item) -> bool:
        return item in self.__dict__["_orig_mod"]


# The original's dictionaries the wrapper shares: its state (parameters, buffers, submodules)
# and the hooks that belong to that state (state-dict hooks registered on either object run
# once, whichever object's state_dict() is called)
_SHARED_DICTS = (
    "_parameters",
    "_buffers",
    "_modules",
    "_non_persistent_buffers_set",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


def _global_hooks() -> bool:
    m = torch.nn.modules.module
    return bool(m._global_forward_hooks or m._global_forward_pre_hooks)


def _share_composable_state(mod: torch.nn.Module, wrapper: torch.nn.Module) -> None:
    """A module a composable API (fully_shard, replicate) already manages, compiled after it:
    the wrapper that replaces it in the tree is managed by the same state, so `fully_shard` of
    a parent leaves its parameters to it, as it leaves the original's."""
    try:
        from torch.distributed._composable_state import _get_module_state, _insert_module_state
    except ImportError:  # a torch without torch.distributed
        return
    state = _get_module_state(mod)
    if state is not None and _get_module_state(wrapper) is None:
        _insert_module_state(wrapper, state)


def disable(fn: Callable | None = None, recursive: bool = True):
    """Never compile `fn`: kiln runs it eagerly, and a call to it inside a compiled function
    ends the graph there (a graph break)."""
    if fn is None:
        return lambda f: disable(f, recursive)
    return frontend.mark_disabled(fn)


def allow_in_graph(fn: Callable) -> Callable:
    """Record calls to `fn` as single graph nodes instead of tracing through it."""
    return frontend.mark_allow_in_graph(fn)


def mark_dynamic(t: torch.Tensor, dim: int | list[int] | tuple[int, ...]) -> None:
    """Treat dimension(s) `dim` of `t` as dynamic: compiled once for any size there. Wins over
    `mark_static` and over `dynamic=False`, as torch.compile's does. kiln never raises when the
    program then pins the size (it guards it: see docs/dynamic_shapes.md)."""
    _mark(t, dim, "_kiln_dynamic_dims", "mark_dynamic")


def maybe_mark_dynamic(t: torch.Tensor, dim: int | list[int] | tuple[int, ...]) -> None:
    """Like `mark_dynamic`, a hint rather than a demand (torch.compiler's name): the dimension
    is symbolic from the first call, and a program that pins it just gets a guard. kiln's
    `mark_dynamic` never raises either, so the two differ only in name."""
    _mark(t, dim, "_kiln_dynamic_dims", "maybe_mark_dynamic")


def mark_static(t, dim: int | list[int] | tuple[int, ...] | None = None):
    """Never treat dimension(s) `dim` of `t` (all of them when None) as dynamic, under
    `dynamic=True` or when the size changes under `dynamic=None` (each size then is its own
    entry); `mark_dynamic` wins over it. An `nn.Module` class is accepted too, as by
    torch.compiler, and returned: kiln already keeps a module's Python attributes constant
    (guarded), so nothing else changes."""
    if isinstance(t, type) and issubclass(t, torch.nn.Module):
        t._kiln_marked_static = True  # type: ignore[attr-defined]
        return t
    if dim is None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"kiln.mark_static: expected a tensor or an nn.Module class, got {type(t).__name__}"
            )
        dim = list(range(t.dim()))
    _mark(t, dim, "_kiln_static_dims", "mark_static")
    return None


def _mark(t, dim, attr: str, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kiln.{name}: expected a tensor, got {type(t).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool):
            raise TypeError(f"kiln.{name}: dimensions are ints, got {d!r}")
        if not -t.dim() <= d < max(t.dim(), 1):
            raise IndexError(f"kiln.{name}: dimension {d} out of range for a {t.dim()}-d tensor")
    existing = set(getattr(t, attr, ()))
    setattr(t, attr, existing | {d % max(t.dim(), 1) for d in dims})


def explain(fn: Callable, **compile_kwargs):
    """`kiln.explain(fn)(*args)`: graphs, op counts, graph breaks with reasons, source lines
    and hints, guards, and compiles of one call; printable."""
    from .capture.explain import report

    def run(*args, **kwargs):
        compile_kwargs.setdefault("backend", "eager")
        compiled = compile(fn, **compile_kwargs)
        compiled(*args, **kwargs)
        return report(compiled._kiln_compiled)

    return run


def reset() -> None:
    """Drop every compiled entry, so the next call of each compiled function compiles again;
    background compiles (`compile.async`) still queued are dropped, and the one in progress
    is waited for."""
    background = sys.modules.get("kiln.runtime.async_compile")  # loaded by its first use
    if background is not None:
        background.cancel_all()
    frontend.reset_all()


def mark_step_begin() -> None:
    """Start a new step for device graphs (`mode="reduce-overhead"`, `backend="cudagraphs"`):
    outputs of earlier replays may be overwritten; see runtime/device_graphs_outputs.py."""
    from .runtime.device_graphs_outputs import mark_step_begin as _mark

    _mark()


def is_compiling() -> bool:
    """True while kiln is capturing (tracing) a frame."""
    return frontend.is_tracing()


def list_backends(exclude_tags=("debug", "experimental")) -> list[str]:
    from .backends.registry import list_backends as _list

    return _list(exclude_tags)


def save_cache_artifacts() -> bytes:
    """Everything kiln's cache folder holds (compiled graphs, C++ libraries, Triton modules) as
    one blob, to warm another machine of the same kind with `load_cache_artifacts` (as
    torch.compiler's namesake). The blob names the kiln code, torch, Python and machine it
    came from."""
    from .runtime.artifacts import export_blob

    return export_blob()


def load_cache_artifacts(blob: bytes) -> int:
    """Write a blob `save_cache_artifacts` made into this machine's cache folder, so a new
    process loads those graphs instead of compiling them; gives how many files it wrote. A
    blob from another kiln, torch, Python or kind of machine is refused with a ValueError
    naming what differs. Load only blobs you trust: they hold code kiln runs."""
    from .runtime.artifacts import import_blob

    return import_blob(blob)
