"""`module(*args)` inside a trace: what `nn.Module.__call__` does, on kiln's interpreter.

Takes a module and call arguments; gives forward's result after running the global and the
module's own forward pre-hooks and hooks, guarding that the hook dictionaries are still what
they were (one cheap check when they are empty, as they almost always are).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from . import guards as G
from .attributes import _class_attr, instance_dict_guard, load_attr
from .data_parallel import call_in_trace, runs_apart
from .sources import AttrSource, ConstSource, GlobalSource

_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")
_mod_globals = None


def call_module(interp, mod: torch.nn.Module, args: tuple, kwargs: dict, site=None) -> Any:
    """`mod(*args)` as Module.__call__ runs it: pre-hooks, forward, forward hooks."""
    tracer = interp.tracer
    d = mod.__dict__
    if runs_apart(mod):
        return call_in_trace(interp, mod, args, kwargs)
    if tracer.broken is None:
        if not tracer.global_hooks_guarded:
            _guard_global_hooks(tracer)
        src = tracer.source_of(mod)
        if src is not None and id(mod) not in tracer.hooks_guarded:
            tracer.hooks_guarded.add(id(mod))  # (held modules live as long as the trace)
            if not (
                d.get("_forward_pre_hooks")
                or d.get("_forward_hooks")
                or d.get("_backward_hooks")
                or d.get("_backward_pre_hooks")
            ):  # _HOOK_DICTS, written out: a module call's one check
                tracer.guards.add(_no_hooks_guard(tracer, src))
            else:
                for h in _HOOK_DICTS:
                    tracer.track(d.get(h), AttrSource(src, h))
    if d.get("_backward_hooks") or d.get("_backward_pre_hooks"):
        tracer.graph_break("module backward hooks are not supported inside a graph")
    gm = torch.nn.modules.module
    if not (
        d.get("_forward_pre_hooks")
        or d.get("_forward_hooks")
        or gm._global_forward_pre_hooks
        or gm._global_forward_hooks
    ):
        return _call(interp, _forward(interp, mod), args, kwargs, site)
    pre = [*gm._global_forward_pre_hooks.items(), *d.get("_forward_pre_hooks", {}).items()]
    for hook_id, hook in pre:
        if hook_id in d.get("_forward_pre_hooks_with_kwargs", ()):
            result = _call(interp, hook, (mod, args, kwargs), {})
            if result is not None:
                args, kwargs = result
        else:
            result = _call(interp, hook, (mod, args), {})
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    forward = _forward(interp, mod)
    post = [*gm._global_forward_hooks.items(), *d.get("_forward_hooks", {}).items()]
    out = _call(interp, forward, args, kwargs, None if post else site)
    for hook_id, hook in post:
        if hook_id in d.get("_forward_hooks_with_kwargs", ()):
            result = _call(interp, hook, (mod, args, kwargs, out), {})
        else:
            result = _call(interp, hook, (mod, args, out), {})
        if result is not None:
            out = result
    return out


def _forward(interp, mod):
    """`mod.forward`, without making a bound method in the usual case: a plain function on the
    class, not shadowed in the instance, read with object's own attribute lookup."""
    cls = type(mod)
    fn = _class_attr(cls, "forward")
    if (
        type(fn) is types.FunctionType
        and "forward" not in mod.__dict__
        and cls.__getattribute__ is _OBJECT_GETATTRIBUTE
    ):
        return types.MethodType(fn, mod)
    return load_attr(interp, mod, "forward")


_OBJECT_GETATTRIBUTE = object.__getattribute__


def _no_hooks_guard(tracer, src) -> G.Guard:
    """A held module's hook dictionaries are read from its instance dictionary (a quarter of
    the cost of four `module.attr` reads, which go through nn.Module's __getattr__ hook)."""
    if isinstance(src, ConstSource):
        instance_dict_guard(tracer, src)
        return G.no_hooks_guard(src, _HOOK_DICTS, src.obj.__dict__)
    return G.no_hooks_guard(src, _HOOK_DICTS, None)


def _guard_global_hooks(tracer) -> None:
    tracer.global_hooks_guarded = True
    g = torch.nn.modules.module.__dict__
    for name in (
        "_global_forward_pre_hooks",
        "_global_forward_hooks",
        "_global_backward_hooks",
        "_global_backward_pre_hooks",
    ):
        tracer.guards.add(
            G.Guard(GlobalSource(g, name, False), "HOOKS", "not {s}", {}, "no global module hooks")
        )


def _call(interp, fn, args, kwargs, site=None):
    return interp_call(interp, fn, args, kwargs, site)


# calls.py imports this module at its end, with interp_call defined; imported first, this
# module is complete (call_module defined) by the time calls.py asks for it
from .calls import interp_call  # noqa: E402
