"""NumPy values that reach a trace from outside it: guarded by value.

Takes a value the tracer tracks (an argument, a continuation's input after a break at
`Tensor.numpy()` or at a NumPy call); gives the guard for a NumPy array or scalar: its type,
dtype, shape and contents, or None for any other value. NumPy work is not recorded in graphs:
each NumPy call is a graph break, run natively between graphs. But Python code after such a
break may read an array's or a scalar's value natively at trace time (`float(a.max())`,
`a[0] + 1`), and that value becomes a constant of the graph; guarded only by type, a later
call with other data would reuse it. Guarded by value, a later call with other data traces
again (and past the entry limit runs eagerly): slower, never wrong.
"""

from __future__ import annotations

import functools
from typing import Any

from . import guards as G
from .sources import Source


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
