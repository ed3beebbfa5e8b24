"""Calls whose only effect is outside the program's values: logging, warnings and cached
helpers, kept out of the graph instead of breaking it.

Takes a call the interpreter meets; gives its result. A log call (`logging.Logger`'s
debug/info/warning/error/exception/critical/log, the module-level `logging.info` and
friends, and methods libraries add to loggers under such names, like transformers'
`warning_once`/`warning_advice`) and `warnings.warn` run for real on the traced call and are
recorded as side effects that the residual program replays after the graph, in program order
with the other effects: one graph instead of a break. Eager's once-only rules hold because
the replay calls the same thing eager calls: `warning_once`'s own cache, `warnings`' filters
and the user module's `__warningregistry__`, at the user's source line. A disabled log level
costs a call that returns at once, never a break.

A `functools.lru_cache`/`cache` wrapper called without tensor arguments is answered by its
cache (eager's answer, exactly), and the answer is guarded by asking the cache again, which
is a dictionary lookup; with tensor arguments the wrapped function is inlined.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import warnings
from typing import Any

import torch

from . import guards as G
from .side_effects import Held

LOG_NAMES = frozenset(
    ("debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log")
)
LOGGER_TYPES = (logging.Logger, logging.LoggerAdapter)
LRU_WRAPPER = functools._lru_cache_wrapper
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def is_log_name(name: str) -> bool:
    """`warning`, and what libraries add beside it: `warning_once`, `info_once`, ..."""
    return name in LOG_NAMES or name.split("_", 1)[0] in LOG_NAMES


def is_logger_method(fn: Any, args: tuple) -> bool:
    """`fn(*args)` is a log call on a logger (its first argument)."""
    return bool(args) and isinstance(args[0], LOGGER_TYPES) and is_log_name(_name(fn))


def is_logging_function(fn: Any) -> bool:
    """A log call of the `logging` module itself (`logging.warning(...)`, `Logger.info`)."""
    return _name(fn) in LOG_NAMES


# reads of logging's configuration: answered now, guarded by asking again on each call
QUERY_NAMES = frozenset(
    ("getLogger", "isEnabledFor", "getEffectiveLevel", "getLevelName", "hasHandlers", "getChild")
)


def is_logging_query(fn: Any) -> bool:
    return _name(fn) in QUERY_NAMES


def answered(interp, fn: Any, args: tuple, kwargs: dict) -> Any:
    """A query of outside state whose answer the trace relies on: the answer, guarded."""
    with torch._C.DisableTorchFunction():
        result = fn(*args, **kwargs)
    tracer = interp.tracer
    if tracer.recording:
        tracer.guards.add(answer_guard(fn, args, kwargs, result))
    return result


def _name(fn: Any) -> str:
    name = getattr(fn, "__name__", "")
    return name if isinstance(name, str) else ""


def replayed(interp, fn: Any, args: tuple, kwargs: dict, replay=None) -> Any:
    """Run an effect-only call for real, off the graph, and record it for the residual
    program. `replay` is `(fn, args, kwargs)` when later calls should call something else."""
    tracer = interp.tracer
    with torch._C.DisableTorchFunction():  # formatting a tensor reads it: not graph work
        result = fn(*args, **kwargs)
    if tracer.recording:
        rfn, rargs, rkwargs = replay or (fn, args, kwargs)
        tracer.side_effects.call(rfn, rargs, rkwargs)
        tracer.effects_visible = True
    return result


# ---- warnings.warn ------------------------------------------------------------------------------
def _bind_warn(message, category=None, stacklevel=1, source=None):
    return message, category, stacklevel, source


def warn(interp, args: tuple, kwargs: dict) -> None:
    """`warnings.warn` at the traced frame's source line: `warn_explicit` with the location
    and registry `warnings.warn` would find, so filters and once-per-location rules apply on
    every call exactly as in eager."""
    message, category, stacklevel, source = _bind_warn(*args, **kwargs)
    if isinstance(message, Warning):
        category = type(message)
    elif category is None:
        category = UserWarning
    if not (isinstance(category, type) and issubclass(category, Warning)):
        raise TypeError(f"category must be a Warning subclass, not '{type(category).__name__}'")
    frames = interp.frames
    level = max(int(stacklevel), 1)
    if level <= len(frames):
        frame = frames[len(frames) - level]
        filename, lineno, _ = frame.location()
        g = frame.globals
        module = g.get("__name__", "<string>")
        registry = g.setdefault("__warningregistry__", {})
        call_args = (message, category, filename, lineno, module, Held(registry), Held(g), source)
        plain = tuple(a.obj if isinstance(a, Held) else a for a in call_args)
        replayed(interp, warnings.warn_explicit, plain, {}, (warnings.warn_explicit, call_args, {}))
        return None
    # the location is a caller of the compiled function: found again on every call
    replayed(interp, warn_outside, (message, category, level - len(frames), source), {})
    return None


def warn_outside(message, category, level: int, source=None) -> None:
    """`warnings.warn` whose location is `level` frames above the compiled function (kiln's
    own frames and residual programs skipped)."""
    f = sys._getframe(1)
    while f is not None and _is_kiln_frame(f):
        f = f.f_back
    for _ in range(level - 1):
        if f is None:
            break
        f = f.f_back
    if f is None:
        warnings.warn_explicit(message, category, "sys", 1, "sys", None, None, source)
        return
    g = f.f_globals
    warnings.warn_explicit(
        message,
        category,
        f.f_code.co_filename,
        f.f_lineno,
        g.get("__name__", "<string>"),
        g.setdefault("__warningregistry__", {}),
        g,
        source,
    )


def _is_kiln_frame(f) -> bool:
    name = f.f_code.co_filename
    return name.startswith(_KILN_DIR) or name.startswith("<kiln entry")


def warn_explicit(interp, args: tuple, kwargs: dict) -> None:
    def held(v):
        return Held(v) if isinstance(v, dict) else v  # registry, module globals: by identity

    replay = (
        warnings.warn_explicit,
        tuple(map(held, args)),
        {k: held(v) for k, v in kwargs.items()},
    )
    return replayed(interp, warnings.warn_explicit, args, kwargs, replay)


# ---- functools.lru_cache ------------------------------------------------------------------------
def cached_call(interp, fn, args: tuple, kwargs: dict, inline) -> Any:
    """A call of an lru_cache wrapper. `inline(f, args, kwargs)` runs a Python function on
    the interpreter (used when the arguments hold tensors: the cache keys them by identity,
    which is no fact a compiled program can rely on)."""
    if is_logger_method(fn, args):  # transformers' warning_once: the cache *is* the once
        return replayed(interp, fn, args, kwargs)
    if _has_tensor(args) or _has_tensor(tuple(kwargs.values())):
        return inline(fn.__wrapped__, args, kwargs)
    # a miss runs the helper, off the graph: its result is a constant; the guard asks the
    # cache again (a lookup; after `cache_clear()` the helper runs again, and a different
    # answer recompiles)
    return answered(interp, fn, args, kwargs)


def answer_guard(fn, args: tuple, kwargs: dict, result: Any) -> G.Guard:
    """`fn(*args, **kwargs)` still answers `result`."""
    op = "==" if isinstance(result, G.CONSTANT_TYPES) else "is"
    label = getattr(fn, "__qualname__", "cached function")
    held = {"f": fn, "a": args, "v": result}
    call = "{f}(*{a})"
    if kwargs:
        held["k"], call = kwargs, "{f}(*{a}, **{k})"
    return G.Guard(
        None,
        "CACHED",
        call + " " + op + " {v}",
        held,
        f"{label}(...) {op} {G._short(result) if op == 'is' else repr(result)[:60]}",
    )


def _has_tensor(x) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, (tuple, list)):
        return any(_has_tensor(v) for v in x)
    if isinstance(x, dict):
        return any(_has_tensor(v) for v in x.values())
    return False
