"""Data-parallel wrappers under kiln: their communication eager, the model compiled.

Two kinds of module are run this way, met as `kiln.compile(module)` (api.py) or as a call
inside a compiled function (module_calls.py, a clean graph break with its reason):

* `DistributedDataParallel`: `ddp(*args)` runs as eager does, with `ddp.module` answered by a
  kiln-compiled `model` for the duration of the call (DataParallelCall);
* a module a composable API manages (`fully_shard`, `replicate`): its forward hooks, which
  all-gather parameters before the forward, reshard after it and arm the backward's
  reduce-scatter, run eagerly around its compiled `forward` (HooksOutsideCall). PyTorch
  marks those hooks as never to be compiled, for the same reasons.

Why the split falls there. `DistributedDataParallel.forward` is bookkeeping around one call of
the wrapped module: it broadcasts buffers, sets the reducer's runtime statistics (a C++ object
a graph cannot hold), marks join hooks, and after the call `prepare_for_backward` walks the
autograd graph from the outputs to find parameters the step did not use. None of it is tensor
computation a graph can record, and all of it must happen on every call exactly as in eager,
so kiln runs that bookkeeping in plain Python and compiles what it wraps. Gradient
communication is untouched: DDP's reducer hooks sit on the parameters' gradient accumulators,
which the compiled backward feeds as eager's would, and the reducer all-reduces its buckets as
they fill. So that they fill during the backward and not at its end, a graph captured inside
DDP's forward is split at DDP's bucket boundaries, one compiled piece (one autograd node) per
bucket (backends/ddp_split.py, applied by the backend kiln.compile binds).

DDP's options keep their eager meaning because their code runs eagerly:
* `find_unused_parameters=True`: `prepare_for_backward` walks from the outputs through kiln's
  autograd node to exactly the parameters the graph read (a graph's inputs are the
  parameters the traced code used), so unused ones are found as in eager;
* `static_graph=True`: the reducer learns the graph on the first step, as in eager; kiln's
  graph is the same on every call its guards admit;
* `no_sync()`: sets `require_backward_grad_sync`, read by DDP's eager forward: gradients
  accumulate locally under it and the next synced backward all-reduces them.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

import torch

from .symbolic import unwrap

SPLIT_NOTE = (
    "DistributedDataParallel.forward runs eagerly around its compiled module {inner}: DDP's "
    "bookkeeping (buffer broadcast, reducer statistics, prepare_for_backward) is not "
    "tensor computation; gradients reach DDP's reducer hooks from the compiled backward and "
    "are all-reduced bucket by bucket as in eager (the graph is split at DDP's bucket "
    "boundaries so they overlap the backward's compute)"
)
SPLIT_HINT = "expected: DDP's communication runs as in eager, the model itself is compiled"


@functools.lru_cache(maxsize=1)
def _ddp_type() -> type | None:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # a torch built without torch.distributed
        return None
    return DistributedDataParallel


def is_data_parallel(mod: Any) -> bool:
    t = _ddp_type()
    return t is not None and isinstance(mod, t)


HOOKS_NOTE = (
    "{label} is managed by {api}: its forward hooks (all-gather before, reshard after, the "
    "backward's reduce-scatter armed) run eagerly around its compiled forward"
)
HOOKS_HINT = "expected: the sharding hooks communicate as in eager, the forward is compiled"


def note(ddp: torch.nn.Module) -> str:
    return SPLIT_NOTE.format(inner=type(ddp.module).__qualname__)


@functools.lru_cache(maxsize=1)
def _state_reader() -> Callable | None:
    try:
        from torch.distributed._composable_state import _get_module_state
    except ImportError:  # a torch built without torch.distributed
        return None
    return _get_module_state


def composable_state(mod: Any):
    """The state of the composable API (fully_shard, replicate) managing `mod`, or None."""
    read = _state_reader()
    return None if read is None else read(mod)


def hooks_note(mod: torch.nn.Module) -> str:
    state = composable_state(mod)
    api = type(state).__name__.replace("FSDPState", "fully_shard") if state else "?"
    return HOOKS_NOTE.format(label=type(mod).__qualname__, api=api)


def run_hooks_outside(mod: torch.nn.Module, forward: Callable, args: tuple, kwargs: dict):
    """`mod(*args, **kwargs)` as Module.__call__ runs it (global and own forward pre-hooks,
    `forward`, forward hooks), with `forward` the compiled one. Backward hooks are not
    modelled: a module with them is called as it is (its forward then uncompiled)."""
    d = mod.__dict__
    if d.get("_backward_hooks") or d.get("_backward_pre_hooks"):
        return torch.nn.Module.__call__(mod, *args, **kwargs)
    g = torch.nn.modules.module
    with_kwargs = d.get("_forward_pre_hooks_with_kwargs", {})
    for hook_id, hook in [*g._global_forward_pre_hooks.items(), *d["_forward_pre_hooks"].items()]:
        if hook_id in with_kwargs:
            result = hook(mod, args, kwargs)
            if result is not None:
                args, kwargs = result
        else:
            result = hook(mod, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    out = forward(*args, **kwargs)
    with_kwargs = d.get("_forward_hooks_with_kwargs", {})
    for hook_id, hook in [*g._global_forward_hooks.items(), *d["_forward_hooks"].items()]:
        if hook_id in with_kwargs:
            result = hook(mod, args, kwargs, out)
        else:
            result = hook(mod, args, out)
        if result is not None:
            out = result
    return out


class HooksOutsideCall:
    """`mod(*args)` with its hooks eager and `compiled` (its forward, compiled) between them."""

    def __init__(self, mod: torch.nn.Module, compiled) -> None:
        self.mod_ref = weakref.ref(mod)
        self.compiled = compiled

    def __call__(self, *args, **kwargs):
        return run_hooks_outside(self.mod_ref(), self.compiled, args, kwargs)

    def __repr__(self) -> str:
        return f"<kiln HooksOutsideCall of {getattr(self.compiled, 'label', self.compiled)}>"


class _CompiledInner:
    """What `ddp.module` is during a call: calls go to the compiled module, everything else
    (attributes DDP or user code reads) to the module itself."""

    def __init__(self, mod: torch.nn.Module, compiled: Callable) -> None:
        self.__dict__["_mod"] = mod
        self.__dict__["_compiled"] = compiled

    def __call__(self, *args, **kwargs):
        return self.__dict__["_compiled"](*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.__dict__["_mod"], name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self.__dict__["_mod"], name, value)


class DataParallelCall:
    """`ddp(*args)` with DDP's bookkeeping eager and `ddp.module` compiled (`compiled` is a
    CompiledFunction of that module)."""

    def __init__(self, ddp: torch.nn.Module, compiled) -> None:
        self.ddp_ref = weakref.ref(ddp)
        self.compiled = compiled

    def __call__(self, *args, **kwargs):
        ddp = self.ddp_ref()
        mods = ddp._modules
        inner = mods["module"]
        if inner is not self.compiled.root_callable:  # the user replaced ddp.module: as eager
            return ddp(*args, **kwargs)
        mods["module"] = _CompiledInner(inner, self.compiled)
        try:
            return ddp(*args, **kwargs)
        finally:
            mods["module"] = inner

    def __repr__(self) -> str:
        return f"<kiln DataParallelCall of {self.compiled.label}>"


# ddp -> {(id(options), id(backend)): DataParallelCall}: one compiled module per DDP module and
# compile settings, whichever compiled function (or continuation) meets the DDP call
_calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def runs_apart(mod: Any) -> bool:
    """Is `mod` a module kiln calls its own way (DDP, or managed by a composable API)?"""
    return is_data_parallel(mod) or composable_state(mod) is not None


def wrapper_call(mod: torch.nn.Module, key: tuple, make_compiled):
    """The call object of `mod` under the compile settings `key` (ids of the options and the
    backend); `make_compiled(fn)` gives a CompiledFunction of a module or a bound method."""
    per = _calls.setdefault(mod, {})
    call = per.get(key)
    if is_data_parallel(mod):
        if call is None or call.compiled.root_callable is not mod._modules["module"]:
            call = per[key] = DataParallelCall(mod, make_compiled(mod._modules["module"]))
    elif call is None:
        own = mod.__dict__.get("_kiln_call")  # a kiln-compiled module: its forward already is
        call = per[key] = HooksOutsideCall(mod, own or make_compiled(mod.forward))
    return call


def call_in_trace(interp, mod: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """`mod(*args)` met while tracing: the graph so far ends; the step after it is the
    wrapper's call (communication eager, the model compiled); the rest continues after it."""
    tracer = interp.tracer
    if tracer.compile_module is None:  # a tracer that only finishes a call: as eager
        return mod(*unwrap(tuple(args)), **unwrap(dict(kwargs)))
    make, key = tracer.compile_module
    call = wrapper_call(mod, key, make)
    if is_data_parallel(mod):
        tracer.graph_break(note(mod), SPLIT_HINT, step=(call, args, kwargs))
    else:
        tracer.graph_break(hooks_note(mod), HOOKS_HINT, step=(call, args, kwargs))
    return call(*unwrap(tuple(args)), **unwrap(dict(kwargs)))
