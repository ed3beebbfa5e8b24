"""`os.environ` inside a trace: each variable read is a guarded fact, writes are graph breaks.

Takes the calls the interpreter makes on `os.environ` (`get`, `[]`, `in`, `os.getenv`, and
anything else: `len`, iteration, `dict(os.environ)`); gives their results, after guarding what
they read: one variable's value (or its absence) per key read, or the whole environment when
the program looks at all of it. A program's behaviour often hangs on an environment variable,
and the variable can change between calls (a test sets it, a launcher exports it); a compiled
entry must not keep the first call's answer. Writes (`os.environ[k] = v`, `pop`, `update`)
change the process's environment, which a graph cannot replay: they are graph breaks, and run.
"""

from __future__ import annotations

import os
from typing import Any

from . import guards as G
from .sources import Namer, Source

ENVIRON = os.environ
ENVIRON_TYPE = type(os.environ)
_ONE_KEY = {"get", "__getitem__", "__contains__"}
_WRITES = {
    "__setitem__",
    "__delitem__",
    "setdefault",
    "pop",
    "popitem",
    "update",
    "clear",
    "__ior__",
}


class EnvironVarSource(Source):
    """`os.environ.get(key)`: a variable's value, None when it is not set."""

    def __init__(self, key: str) -> None:
        self.key = key

    def describe(self) -> str:
        return f"os.environ.get({self.key!r})"

    def expr(self, namer: Namer) -> str:
        return f"{namer.const(ENVIRON, 'environ')}.get({self.key!r})"


def is_environ(obj: Any) -> bool:
    return type(obj) is ENVIRON_TYPE


def call(interp, fn, args: tuple, kwargs: dict):
    """A Python-level method of `os.environ` called with `args[0]` the environment."""
    from .calls import _break_and_run, native_call

    name = getattr(fn, "__name__", "")
    tracer = interp.tracer
    if name in _WRITES:
        return _break_and_run(
            interp,
            fn,
            args,
            kwargs,
            f"os.environ.{name} changes the process environment, which a graph cannot replay",
            "set environment variables outside the compiled function",
        )
    if tracer.recording:
        if name in _ONE_KEY and len(args) > 1 and type(args[1]) is str:
            guard_var(tracer, args[1])
        else:
            guard_all(tracer)
    return native_call(interp, fn, args, kwargs)


def contains(interp, key) -> bool:
    """`key in os.environ`."""
    if interp.tracer.recording:
        if type(key) is str:
            guard_var(interp.tracer, key)
        else:
            guard_all(interp.tracer)
    return key in ENVIRON


def guard_var(tracer, key: str) -> None:
    tracer.guards.add(G.constant_guard(EnvironVarSource(key), ENVIRON.get(key)))


def guard_all(tracer) -> None:
    """The whole environment, as the encoded dictionary `os.environ` keeps (a dict compare)."""
    snapshot = dict(ENVIRON._data)  # type: ignore[attr-defined]
    tracer.guards.add(
        G.Guard(
            None,
            "ENVIRON",
            "{e}._data == {v}",
            {"e": ENVIRON, "v": snapshot},
            f"os.environ unchanged ({len(snapshot)} variables)",
        )
    )
