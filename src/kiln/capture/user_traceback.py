"""The user's traceback for an exception raised by user code inside a compiled function.

kiln runs the user's frames on its own interpreter, so a user exception's real traceback is a
stack of kiln's frames (the frontend, the interpreter loop, opcode handlers) with no user line
in it. This module gives it back the traceback eager Python would show: as the exception
leaves each interpreted frame, `note_frame` records that frame's code and line on the
exception; at the compiled callable's boundary `rewrite` replaces everything below it with one
real frame object per recorded user frame (made once per code object: a frame whose code
names the user's file and function) followed by the frames that really ran below the last of
kiln's (a library function the user called, say). The exception's type, message, cause and
context are untouched.
"""

from __future__ import annotations

import os
import sys
import types
import weakref

_ATTR = "__kiln_frames__"
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_FX_DIR = os.sep + os.path.join("torch", "fx") + os.sep
# a real, finished frame per user code object, whose own code has the user's file and names
_frames: "weakref.WeakKeyDictionary[types.CodeType, types.FrameType]" = weakref.WeakKeyDictionary()


def note_frame(exc: BaseException, frame, line: int | None, reraise: bool = False) -> None:
    """`exc` leaves interpreted `frame` at `line` (innermost frames come first). A re-raise
    (RERAISE: the end of an `except` that did not match, `with`, `finally`) adds no entry
    where the frame already has one from catching it, as in CPython."""
    frames = _frames_of(exc)
    if frames is None:
        return
    if reraise and frames and frames[-1][2] == id(frame):
        return
    frames.append((frame.code, line, id(frame)))


def caught(exc: BaseException, frame, line: int | None) -> None:
    """A handler of interpreted `frame` takes `exc` raised at `line`: the traceback keeps this
    frame's entry (a later re-raise goes on from it, as CPython's traceback does)."""
    frames = _frames_of(exc)
    if frames is not None and not (frames and frames[-1][2] == id(frame)):
        frames.append((frame.code, line, id(frame)))


def _frames_of(exc: BaseException) -> list | None:
    d = getattr(exc, "__dict__", None)
    if d is None:  # an exception object without a __dict__: its traceback stays kiln's
        return None
    frames = d.get(_ATTR)
    if frames is None:
        frames = d[_ATTR] = []
    return frames


def _internal(filename: str) -> bool:
    return (
        filename.startswith(_KILN_DIR)
        or filename.startswith(("<kiln ", "<eval_with_key>"))
        or _FX_DIR in filename
    )


def _frame_for(code: types.CodeType) -> types.FrameType:
    frame = _frames.get(code)
    if frame is None:
        stub = compile("import sys\n___frame = sys._getframe()", code.co_filename, "exec")
        names = {"co_name": code.co_name}
        if sys.version_info >= (3, 11):
            names["co_qualname"] = code.co_qualname
        scope: dict = {"__name__": "kiln_user_frame"}
        exec(stub.replace(**names), scope)
        frame = _frames[code] = scope.pop("___frame")
    return frame


def rewrite(exc: BaseException) -> types.TracebackType | None:
    """The traceback to raise `exc` with from the compiled callable's frame: the user's
    frames, then what ran below kiln's last frame (None: leave it as it is). The tracebacks
    of its cause and context (exceptions the user's code was handling) are made the user's
    in place."""
    seen = {id(exc)}
    linked = [exc.__cause__, exc.__context__]
    while linked:
        other = linked.pop()
        if other is None or id(other) in seen:
            continue
        seen.add(id(other))
        tb = _user_tb(other, keep_first=False)
        if tb is not None:
            other.__traceback__ = tb
        linked += [other.__cause__, other.__context__]
    return _user_tb(exc, keep_first=True)


def _user_tb(exc: BaseException, keep_first: bool) -> types.TracebackType | None:
    tb = exc.__traceback__
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    internal = [i for i, t in enumerate(entries) if _internal(t.tb_frame.f_code.co_filename)]
    d = getattr(exc, "__dict__", None)
    user = d.pop(_ATTR, None) if d is not None else None
    if not internal or (internal == [0] and keep_first and not user):
        return None
    out: types.TracebackType | None = None
    for t in reversed(entries[internal[-1] + 1 :]):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    for code, line, _ in user or ():
        # lasti -1: no column markers (the frame's own code is not the user's)
        out = types.TracebackType(out, _frame_for(code), -1, line or code.co_firstlineno)
    if not keep_first:  # a linked exception: what ran above kiln's first frame stays
        for t in reversed(entries[: internal[0]]):
            out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out
