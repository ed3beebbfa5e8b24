"""Opcode handlers: `except*` (PEP 654), on the exception groups CPython itself would make.

`try: ... except* E as g: ...` matches with CHECK_EG_MATCH (split the group: the part that
matches `E` goes to the handler, the rest on to the next clause) and ends with
PREP_RERAISE_STAR (3.11; CALL_INTRINSIC_2 from 3.12): the exceptions the handlers raised or
re-raised, merged into what propagates. These are CPython's rules (ceval.c's
exception_group_match, exceptions.c's _PyExc_PrepReraiseStar), written over the public
`BaseExceptionGroup` API.
"""

from __future__ import annotations

from .bytecode import opcode


@opcode("CHECK_EG_MATCH")
def op_check_eg_match(interp, frame, inst):
    match_type = frame.stack.pop()
    _check_star_type(match_type)
    exc = frame.stack[-1]
    match, rest = _group_match(exc, match_type)
    if match is None:
        frame.stack.append(None)
        return
    frame.stack[-1] = rest
    frame.stack.append(match)
    interp.current_exc = match  # what `sys.exc_info()` gives inside the handler
    for part in (exc, match, rest):  # split from the original: re-raised, not raised anew
        if part is not None:
            interp.split_parts[id(part)] = part


@opcode("PREP_RERAISE_STAR", until=(3, 12))
def op_prep_reraise_star(interp, frame, inst):
    excs = frame.stack.pop()
    orig = frame.stack.pop()
    frame.stack.append(prep_reraise_star(interp, orig, excs))


def raised_anew(interp, exc) -> None:
    """`raise g` of a split part (not a bare `raise`): CPython's traceback of it changes, so it
    counts as a new exception."""
    if interp.split_parts.get(id(exc)) is exc:
        del interp.split_parts[id(exc)]


def _check_star_type(match_type) -> None:
    types = match_type if isinstance(match_type, tuple) else (match_type,)
    for t in types:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise TypeError(
                "catching classes that do not inherit from BaseException is not allowed"
            )
        if issubclass(t, BaseExceptionGroup):
            raise TypeError(
                "catching ExceptionGroup with except* is not allowed. Use except instead."
            )


def _group_match(exc, match_type):
    """(match, rest) of `exc` against `match_type`: a naked exception that matches is wrapped
    in a group of one; a group is split; no match is (None, exc)."""
    if exc is None:
        return None, None
    if isinstance(exc, match_type):
        if isinstance(exc, BaseExceptionGroup):
            return exc, None
        wrapped = BaseExceptionGroup("", [exc])
        wrapped.__traceback__ = exc.__traceback__
        return wrapped, None
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(match_type)
    return None, exc


def prep_reraise_star(interp, orig, excs: list):
    """What propagates from a `try/except*`: `excs` holds what each clause raised (None for a
    clause that finished) and, last, the unmatched rest. Re-raised parts keep the shape they
    had in `orig`; new exceptions are grouped beside them.

    CPython tells a re-raised part (a bare `raise`, the rest) from a new exception by its
    metadata: a split shares the original's traceback object, which a new raise extends. Here
    the traceback passes through kiln's own frames, so the parts split off are remembered by
    identity instead (`interp.split_parts`)."""
    if not excs:
        return None
    if not isinstance(orig, BaseExceptionGroup):
        # a naked exception was caught and wrapped: one clause ran, one exception to raise
        return excs[0]
    raised, reraised = [], []
    for e in excs:
        if e is None:
            continue
        (reraised if interp.split_parts.get(id(e)) is e else raised).append(e)
    reraised_eg = _projection(orig, reraised)
    if not raised:
        return reraised_eg
    if reraised_eg is not None:
        raised.append(reraised_eg)
    return raised[0] if len(raised) == 1 else ExceptionGroup("", raised)


def _projection(orig, keep: list):
    """The part of `orig` made of the leaf exceptions in `keep`'s groups, in orig's shape."""
    if not keep:
        return None
    ids: set[int] = set()
    for e in keep:
        _leaf_ids(e, ids)
    match, _ = orig.split(lambda leaf: id(leaf) in ids)
    return match


def _leaf_ids(e, out: set[int]) -> None:
    if isinstance(e, BaseExceptionGroup):
        for sub in e.exceptions:
            _leaf_ids(sub, out)
    else:
        out.add(id(e))
