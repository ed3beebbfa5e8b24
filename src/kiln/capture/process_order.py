"""What a trace computed that holds in its own process only: notes for the capture cache.

Takes the values the interpreter iterates and the native calls it makes; sets
`tracer.process_specific` (a reason) when the trace's result may depend on something another
process of the same program computes differently:

* the order of a set or frozenset whose members hash by string (`PYTHONHASHSEED` randomizes
  it per process) or by identity (objects without `__hash__`), iterated by the frame or passed
  to a native function that may iterate it (`list(s)`, `"".join(s)`);
* `hash()` of anything but a number (a string's, an object's);
* `id()` (builtin_specials.py notes that one).

Within one process such a trace is replayed soundly (the same set, the same order), so only
the capture cache (capture_cache.py) reads the note: a trace with one is not kept.
"""

from __future__ import annotations

import builtins
from typing import Any

# native functions whose answer does not depend on a set's order
_ORDER_FREE = frozenset(
    map(id, (builtins.len, builtins.sorted, builtins.set, builtins.frozenset, builtins.isinstance))
)
_NUMBERS = (int, float, bool, complex, type(None))


def _order_depends(value: Any) -> bool:
    """Whether iterating `value` (a set or frozenset) may give another order elsewhere."""
    return isinstance(value, (set, frozenset)) and not all(
        type(m) in _NUMBERS or type(m) is tuple and all(type(x) in _NUMBERS for x in m)
        for m in value
    )


def note_iteration(tracer: Any, value: Any) -> None:
    if tracer.process_specific is None and _order_depends(value):
        tracer.process_specific = "it iterates a set whose order differs between processes"


def note_call(tracer: Any, fn: Any, args: tuple, kwargs: dict) -> None:
    if tracer.process_specific is not None or id(fn) in _ORDER_FREE:
        return
    if fn is builtins.hash and args and type(args[0]) not in _NUMBERS:
        tracer.process_specific = "it reads hash() of a value (another number in another process)"
        return
    owner = getattr(fn, "__self__", None)
    for a in (owner, *args, *kwargs.values()):
        if _order_depends(a):
            tracer.process_specific = (
                f"it passes a set to {getattr(fn, '__qualname__', fn)!s:.60}, whose result may "
                "follow the set's order (another order in another process)"
            )
            return
