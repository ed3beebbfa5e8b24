"""Exceptions of the capture stage.

`Unsupported` is the user-facing error (fullgraph=True, bad input). The others are internal
signals that must never be caught by the user's own `try/except` inside a traced frame, so they
derive from BaseException and the interpreter lets them pass its exception dispatch.
"""

from __future__ import annotations


class Unsupported(RuntimeError):
    """kiln could not capture something the user asked it to capture whole (fullgraph=True)."""


class KilnEagerWarning(UserWarning):
    """kiln runs a compiled function (or the rest of one, after a graph break it cannot resume)
    eagerly: correct, but not compiled. Said once per code object, with the reason, the user's
    source line and a hint; `options={"warn_eager": False}` or `KILN_WARN_EAGER=0` silences it,
    as does a `warnings` filter on this category."""


class KilnRecompileLimitWarning(KilnEagerWarning):
    """A compiled function reached `cache_size_limit` entries and its guards still failed:
    kiln stops compiling it and runs it eagerly."""


class KilnInternal(BaseException):
    """Base of signals that pass through the traced program untouched."""


class AbortTrace(KilnInternal):
    """Stop tracing now: the interpreter cannot go on (an opcode it does not know, say).

    Raised only where the frame can be rerun from the start by CPython, i.e. before the traced
    call had any effect visible outside it; the frontend then runs the frame eagerly.
    """

    def __init__(self, reason: str, where: str = "", hint: str = ""):
        super().__init__(reason)
        self.reason, self.where, self.hint = reason, where, hint


class FullgraphBreak(KilnInternal):
    """A graph break under fullgraph=True; converted to `Unsupported` at the top of the call."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ResumableBreak(KilnInternal):
    """Raised by the tracer at a break the innermost CALL or branch handler can turn into a
    continuation."""

    def __init__(self, reason: str, hint: str, where: str, step: tuple | None = None):
        super().__init__(reason)
        self.reason, self.hint, self.where = reason, hint, where
        self.step = step  # (fn, args, kwargs) the plain-Python step calls instead, or None


class SubgraphBreak(KilnInternal):
    """A graph break while a control-flow operator's branch is captured as a subgraph: the
    operator (capture/higher_order.py) gives up on the subgraph and breaks before itself."""

    def __init__(self, reason: str, hint: str = "", where: str = ""):
        super().__init__(reason)
        self.reason, self.hint, self.where = reason, hint, where


class GraphBreakAt(KilnInternal):
    """The graph ends here. `chain` is root..innermost; `step` is what runs in plain Python:
    ("call", fn, args, kwargs), ("store", obj, name, value) (an attribute store) or
    ("branch", value, jump_if, target_pc, next_pc)."""

    def __init__(self, chain: list, step: tuple, brk: ResumableBreak):
        super().__init__(brk.reason)
        self.chain, self.step = chain, step
        self.reason, self.hint, self.where = brk.reason, brk.hint, brk.where
