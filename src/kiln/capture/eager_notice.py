"""Telling the user, once, that kiln runs a function eagerly: a Python warning, not a log line.

Takes the compiled callable that gives up (a function, a module's forward, or the continuation
after a graph break), the reason, the user's source location and a hint; gives one
`KilnEagerWarning` (or `KilnRecompileLimitWarning`) per code object and reason kind, attributed
to the user's file and line so that `warnings` filters and tools point at the user's code.
Eager fallbacks are correct but slow, so they must never be silent; `options={"warn_eager":
False}`, `KILN_WARN_EAGER=0` (options.py) or a `warnings` filter on the category silence them.
"""

from __future__ import annotations

import re
import types
import warnings

import torch

from .errors import KilnEagerWarning, KilnRecompileLimitWarning

_warned: set[tuple] = set()  # (code object or label, kind) already warned about

_SILENCE = (
    "(said once per function; silence it with options={'warn_eager': False}, "
    "KILN_WARN_EAGER=0, or warnings.filterwarnings('ignore', category=kiln.KilnEagerWarning))"
)
_WHERE = re.compile(r"^(?P<file>.+?):(?P<line>\d+) in ")


def root_code(cf):
    """The code object that names a compiled callable: its function's (or forward's)."""
    root = getattr(cf, "root_cf", cf).root_callable
    if isinstance(root, torch.nn.Module):
        root = type(root).forward
    if isinstance(root, types.MethodType):
        root = root.__func__
    return getattr(root, "__code__", None)


def warn_eager(cf, reason: str, where: str = "", hint: str = "") -> None:
    """`cf` runs eagerly from now on (`reason`); say so once for its code object."""
    first = reason.splitlines()[0] if reason else "unknown reason"
    text = f"kiln: {cf.label} runs eagerly from now on: {first}"
    if where:
        text += f"\n  at {where}"
    if hint:
        text += f"\n  hint: {hint}"
    _warn(cf, "eager:" + cf.label, text + "\n" + _SILENCE, KilnEagerWarning, where)


def warn_recompile_limit(cf, count: int, failures: str) -> None:
    """`cf` reached `cache_size_limit` entries and a call still matched none."""
    text = (
        f"kiln: {cf.label} has {count} compiled entries (cache_size_limit) and the guards still "
        f"failed, so kiln stops compiling it and runs it eagerly from now on. The guards that "
        f"failed on this call: {failures}. Hint: mark the changing sizes dynamic "
        "(kiln.mark_dynamic or dynamic=True), pass the changing Python values as tensors, or "
        "raise the limit with options={'cache_size_limit': N} or KILN_CACHE_SIZE_LIMIT=N."
    )
    _warn(cf, "limit", text + "\n" + _SILENCE, KilnRecompileLimitWarning, "")


def _warn(cf, kind: str, text: str, category, where: str) -> None:
    if not cf.opts.warn_eager:
        return
    code = root_code(cf)
    key = (code if code is not None else cf.label, kind)
    if key in _warned:
        return
    _warned.add(key)
    m = _WHERE.match(where)
    if m:
        filename, lineno = m["file"], int(m["line"])
    elif code is not None:
        filename, lineno = code.co_filename, code.co_firstlineno
    else:
        filename, lineno = "<kiln>", 0
    warnings.warn_explicit(text, category, filename, lineno, registry={})


def forget() -> None:
    """`kiln.reset()`: functions compiled again may warn again."""
    _warned.clear()
