"""Opcode handlers: the `match` statement's pattern tests (MATCH_SEQUENCE, MATCH_MAPPING,
MATCH_KEYS, MATCH_CLASS, GET_LEN).

Each does what CPython's does (PEP 634), on real values. The subject's items, keys and
attributes are read through kiln's own `len`, `.get` and attribute loads, so what a pattern
looked at is guarded exactly as the same reads written out by hand would be; the jumps between
cases are ordinary branches on Python values.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence

from .bytecode import opcode

# types whose one positional sub-pattern is the subject itself (CPython's _Py_TPFLAGS_MATCH_SELF,
# inherited by subclasses): `case int(n):`
_MATCH_SELF = (bool, bytearray, bytes, dict, float, frozenset, int, list, set, str, tuple)
# registered as Sequence, but not sequences to `match` (no Py_TPFLAGS_SEQUENCE)
_NOT_SEQUENCES = (str, bytes, bytearray)


@opcode("MATCH_SEQUENCE")
def op_match_sequence(interp, frame, inst):
    subject = frame.stack[-1]
    frame.stack.append(isinstance(subject, Sequence) and not isinstance(subject, _NOT_SEQUENCES))


@opcode("MATCH_MAPPING")
def op_match_mapping(interp, frame, inst):
    frame.stack.append(isinstance(frame.stack[-1], Mapping))


@opcode("GET_LEN")
def op_get_len(interp, frame, inst):
    from .calls import interp_call

    frame.stack.append(interp_call(interp, builtins.len, (frame.stack[-1],), {}))


@opcode("MATCH_KEYS")
def op_match_keys(interp, frame, inst):
    """[subject, keys] -> [subject, keys, values or None]."""
    from .calls import interp_call, load_attr

    keys = frame.stack[-1]
    subject = frame.stack[-2]
    if not keys:
        frame.stack.append(())
        return
    get = load_attr(interp, subject, "get")
    missing = object()
    seen = set()
    values = []
    for key in keys:
        if key in seen:
            raise ValueError(f"mapping pattern checks duplicate key ({key!r})")
        seen.add(key)
        value = interp_call(interp, get, (key, missing), {})
        if value is missing:
            frame.stack.append(None)
            return
        values.append(value)
    frame.stack.append(tuple(values))


@opcode("MATCH_CLASS")
def op_match_class(interp, frame, inst):
    """[subject, cls, names] -> a tuple of the matched attributes, or None."""
    names = frame.stack.pop()
    cls = frame.stack.pop()
    subject = frame.stack.pop()
    frame.stack.append(_match_class(interp, subject, cls, inst.arg, names))


def _match_class(interp, subject, cls, nargs: int, names: tuple):
    from .calls import load_attr

    if not isinstance(cls, type):
        raise TypeError("called match pattern must be a class")
    if not isinstance(subject, cls):
        return None
    seen: set[str] = set()
    attrs = []

    def attr(name):
        if name in seen:
            raise TypeError(f"{cls.__name__}() got multiple sub-patterns for attribute {name!r}")
        seen.add(name)
        try:
            return True, load_attr(interp, subject, name)
        except AttributeError:
            return False, None

    if nargs:
        try:
            match_args = load_attr(interp, cls, "__match_args__")
        except AttributeError:
            match_args = None
        if match_args is not None and not isinstance(match_args, tuple):
            raise TypeError(
                f"{cls.__name__}.__match_args__ must be a tuple (got {type(match_args).__name__})"
            )
        match_self = match_args is None and issubclass(cls, _MATCH_SELF)
        allowed = 1 if match_self else len(match_args or ())
        if nargs > allowed:
            plural = "" if allowed == 1 else "s"
            raise TypeError(
                f"{cls.__name__}() accepts {allowed} positional sub-pattern{plural} ({nargs} given)"
            )
        if match_self:
            attrs.append(subject)
        else:
            for name in match_args[:nargs]:
                if not isinstance(name, str):
                    raise TypeError(
                        f"__match_args__ elements must be strings (got {type(name).__name__})"
                    )
                found, value = attr(name)
                if not found:
                    return None
                attrs.append(value)
    for name in names:
        found, value = attr(name)
        if not found:
            return None
        attrs.append(value)
    return tuple(attrs)
