"""NumPy values that reach a trace from outside it: graph inputs, or guarded by value.

Takes a value the tracer tracks (an argument, a global, an attribute, a container's item); an
ndarray whose memory torch can share becomes a graph input (`lift`: a `torch.from_numpy` view
fetched on every call, guarded like a tensor, so new data of the same shape reuses the
compiled graph, as torch.compile does). Gives the value guard for the rest, a NumPy array
torch cannot share (object or string dtypes, non-native byte order, read-only, misaligned,
an ndarray subclass: the reason goes to `KILN_LOGS=perf_hints`) or a NumPy scalar: its type,
dtype, shape and contents; None for any other value. Python code may read such a value's data
natively at trace time (`float(a.max())`, `a[0] + 1`), and that value becomes a constant of
the graph; guarded only by type, a later call with other data would reuse it. Guarded by
value, a later call with other data traces again (and past the entry limit runs eagerly):
slower, never wrong.
"""

from __future__ import annotations

import functools
from typing import Any

from . import guards as G
from .sources import Source


def lift(tracer, value: Any, source: Source) -> bool:
    """Make the ndarray `value` read from `source` a graph input (numpy_trace.lift_input);
    False for any other value, and for an array torch cannot share (logged with the reason),
    which the caller guards by value."""
    if type(value).__module__ != "numpy":
        return False
    import numpy as np

    from . import numpy_trace

    if not isinstance(value, np.ndarray):
        return False  # a NumPy scalar: a constant of the graph, as torch.compile makes it
    why = numpy_trace.unshared(value)
    if why is None and numpy_trace.lift_input(tracer, value, source):
        return True
    from .. import logs

    logs.log(
        "perf_hints",
        lambda: (
            f"NumPy array {source.describe()} ({value.dtype}{list(value.shape)}) is "
            f"guarded by its contents, not a graph input: {why or 'no tensor form'}; a call "
            "with other data compiles again"
        ),
    )
    return False


def guard(source: Source, value: Any) -> G.Guard | None:
    """The value guard of a NumPy array or scalar, None for anything else."""
    if type(value).__module__ != "numpy":
        return None
    import numpy as np

    if not isinstance(value, (np.ndarray, np.generic)):
        return None
    # NaN where NaN was (equal_nan is for float and complex dtypes only)
    equal = functools.partial(np.array_equal, equal_nan=np.asarray(value).dtype.kind in "fc")
    if isinstance(value, np.ndarray):
        held = {"t": np.ndarray, "d": value.dtype, "sh": value.shape, "eq": equal}
        held["v"] = value.copy()
        check = "type({s}) is {t} and {s}.dtype == {d} and {s}.shape == {sh} and {eq}({s}, {v})"
        text = f"NumPy array == {np.array2string(value, threshold=6)} ({value.dtype})"
        return G.Guard(source, "NUMPY", check, held, text)
    held = {"t": type(value), "v": value, "eq": equal}
    check = "type({s}) is {t} and {eq}({s}, {v})"
    return G.Guard(source, "NUMPY", check, held, f"== {value!r:.60}")
