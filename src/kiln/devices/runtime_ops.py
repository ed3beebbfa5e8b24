"""The ops kiln's generated wrappers call that ATen does not have (`torch.ops.kiln.*`).

Takes nothing; registers `kiln::check_index(bad, value, op, dim, size, index_error)`, which
raises the error eager raises for an out-of-range index (IndexError; RuntimeError for gather)
when `bad` is true. Lowerings (lower/indirect.py) emit calls to it as extern ops; a wrapper
calls its Python implementation, `check_index`, directly (codegen/bindings.py).

Why it lives here, beside the device interface: lowerings emit these ops and every device's
wrapper calls them, and a wrapper loaded from the compiled-artifact cache (backends/warm.py)
must find them without importing the lowerings (codegen/bindings.py imports this module).
"""

from __future__ import annotations

import torch

_LIB = torch.library.Library("kiln", "FRAGMENT")
_LIB.define(
    "check_index(Tensor bad, Tensor value, str op, int dim, int size, bool index_error) -> ()"
)


def check_index(
    bad: torch.Tensor, value: torch.Tensor, op: str, dim: int, size: int, index_error: bool
) -> None:
    if bool(bad):
        kind = IndexError if index_error else RuntimeError
        raise kind(
            f"index {int(value)} is out of bounds for dimension {dim} with size {size} "
            f"(in {op}; kiln checks every index before its kernels' results are returned)"
        )


_LIB.impl("check_index", check_index, "CompositeExplicitAutograd")
CHECK_INDEX = torch.ops.kiln.check_index.default
