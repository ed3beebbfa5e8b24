"""Builtins with interpreter semantics: `getattr`, `hasattr`, `setattr`, `delattr`, `print`,
`len`, `iter`, `id`, `warnings.warn` (replayed: effect_calls.py), `min`/`max` of symbolic sizes
(kept symbolic), and those that look at the calling frame: `locals`, `vars`, `globals`, `dir`,
`sys.exc_info`, `sys.exception`.

Takes the call's arguments; gives what the builtin returns, but through kiln's own attribute
and dunder handling, so what they read is guarded (getattr), what they change is replayed
(setattr, print), user-level `__len__`/`__iter__` run on the interpreter, and `locals()` shows
the interpreted frame's variables (natively it would show kiln's own).
"""

from __future__ import annotations

import builtins
import operator
import sys
import types
import warnings

import torch

from . import effect_calls
from .attributes import delete_attr, load_attr, python_dunder, store_attr
from .symbolic import _Sym, pick


def interp_call(interp, fn, args, kwargs):
    from .calls import interp_call as call

    return call(interp, fn, args, kwargs)


def native_call(interp, fn, args, kwargs):
    from .calls import native_call as call

    return call(interp, fn, args, kwargs)


def _getattr(interp, args, kwargs):
    if len(args) == 3:
        try:
            return load_attr(interp, args[0], args[1])
        except AttributeError:
            return args[2]
    return load_attr(interp, args[0], args[1])


def _hasattr(interp, args, kwargs):
    try:
        load_attr(interp, args[0], args[1])
        return True
    except AttributeError:
        return False


def _setattr(interp, args, kwargs):
    store_attr(interp, args[0], args[1], args[2])


def _delattr(interp, args, kwargs):
    delete_attr(interp, args[0], args[1])


def _print(interp, args, kwargs):
    tracer = interp.tracer
    if any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values())):
        tracer.graph_break(
            "print() of a tensor needs its values",
            "print outside the compiled function, or print metadata only",
        )
    elif tracer.recording:
        if kwargs.get("file") is not None:
            tracer.graph_break("print(file=...) writes to a stream kiln does not replay")
        tracer.side_effects.print_call(args, dict(kwargs))
        tracer.effects_visible = True
    return native_call(interp, print, args, kwargs)


def _len(interp, args, kwargs):
    if len(args) == 1 and isinstance(args[0], torch.Tensor) and args[0].dim() > 0:
        return args[0].shape[0]  # symbolic when the size is dynamic
    fn = python_dunder(args[0], "__len__") if len(args) == 1 else None
    if fn is not None:
        n = interp_call(interp, fn, (args[0],), {})
        if not isinstance(n, int):
            raise TypeError(f"'{type(n).__name__}' object cannot be interpreted as an integer")
        return n
    return len(*args)


def _frame_locals(interp) -> dict:
    """What `locals()` gives in the frame that called it: its bound variables, closure cells
    read through, in CPython's order (arguments and variables, then cells, then free
    variables); a new dictionary, as CPython's snapshot is."""
    frame = interp.frames[-1]
    code = frame.code
    cells = {*code.co_cellvars, *code.co_freevars}
    out = {}
    for name in dict.fromkeys((*code.co_varnames, *code.co_cellvars, *code.co_freevars)):
        if name not in frame.locals:
            continue
        value = frame.locals[name]
        if name in cells and isinstance(value, types.CellType):
            try:
                value = value.cell_contents
            except ValueError:  # an empty cell: not bound yet
                continue
        out[name] = value
    return out


def _locals(interp, args, kwargs):
    if args or kwargs:
        return locals(*args, **kwargs)  # CPython's TypeError
    return _frame_locals(interp)


def _vars(interp, args, kwargs):
    if not args and not kwargs:
        return _frame_locals(interp)
    if len(args) == 1 and not kwargs:
        try:  # read as an attribute: guarded (and replayed, when stored to) like one
            return load_attr(interp, args[0], "__dict__")
        except AttributeError:
            raise TypeError("vars() argument must have __dict__ attribute") from None
    return vars(*args, **kwargs)


def _globals(interp, args, kwargs):
    if args or kwargs:
        return globals(*args, **kwargs)
    return interp.frames[-1].globals


def _dir(interp, args, kwargs):
    if not args and not kwargs:
        return sorted(_frame_locals(interp))
    return dir(*args, **kwargs)


def _iter(interp, args, kwargs):
    fn = python_dunder(args[0], "__iter__") if len(args) == 1 else None
    return iter(interp_call(interp, fn, (args[0],), {})) if fn else iter(*args)


def _minmax(op, native):
    """`min`/`max` over numbers of which some are symbolic (a size, `min(n, 6)`): guarded
    comparisons, the chosen value kept symbolic (symbolic.pick); otherwise the builtin."""

    def special(interp, args, kwargs):
        values = list(args[0]) if len(args) == 1 and type(args[0]) in (list, tuple) else args
        if (
            not kwargs
            and values
            and any(isinstance(v, _Sym) for v in values)
            and all(isinstance(v, _Sym) or type(v) in (int, float, bool) for v in values)
        ):
            return pick(op, list(values))
        return native_call(interp, native, args, kwargs)

    return special


def _id(interp, args, kwargs):
    """`id(obj)` of an object from outside: a number that names that object, so a later call
    gets the same number only for the same object (its identity is guarded)."""
    if len(args) == 1 and not kwargs:
        tracer = interp.tracer
        tracer.process_specific = "it reads id() of an object (another number in another process)"
        src = tracer.source_of(args[0]) if tracer.recording else None
        if src is not None:
            from . import guards

            tracer.guards.add(guards.id_guard(src, args[0]))
    return id(*args, **kwargs)


def _exc_info(interp, args, kwargs):
    """The exception the interpreted code is handling (natively: kiln's own, or none)."""
    exc = _exception(interp, args, kwargs)
    return (None, None, None) if exc is None else (type(exc), exc, exc.__traceback__)


def _exception(interp, args, kwargs):
    if args or kwargs:
        raise TypeError("takes no arguments")
    return interp.current_exc


SPECIAL = {
    sys.exc_info: _exc_info,
    sys.exception: _exception,
    builtins.id: _id,
    builtins.min: _minmax(operator.lt, builtins.min),
    builtins.max: _minmax(operator.gt, builtins.max),
    builtins.getattr: _getattr,
    builtins.hasattr: _hasattr,
    builtins.setattr: _setattr,
    builtins.delattr: _delattr,
    builtins.print: _print,
    builtins.len: _len,
    builtins.iter: _iter,
    warnings.warn: effect_calls.warn,
    warnings.warn_explicit: effect_calls.warn_explicit,
    builtins.locals: _locals,
    builtins.vars: _vars,
    builtins.globals: _globals,
    builtins.dir: _dir,
}
