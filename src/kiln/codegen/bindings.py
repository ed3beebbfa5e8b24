"""Extern calls through torch's generated Python bindings instead of `OpOverload.__call__`.

Takes the ATen overloads a wrapper program calls (`WrapperProgram.externs`); gives, for the
hot ones, the binding that dispatches to the same overload with less Python in the way.
`torch.ops.aten.convolution.default(...)` builds an argument stack from the schema in Python
and C++ on every call; `torch._C._VariableFunctions.convolution` parses its arguments once, in
C++. On the H200 host (torch 2.11) a call's CPU time went: convolution 30 -> 21 us, addmm 24 ->
21 us, cuDNN attention 32 -> 26 us — a channels-last ResNet-50 makes 53 convolution calls per
forward, and on a GPU whose kernels are fast the CPU time of the calls is the step time.

kiln's own bounds check is called as the Python function it is (`PLAIN`). Only overloads
listed here are swapped, each for the binding whose arguments the wrapper's
spelling (positional in schema order, keyword-only ones by name) resolves to that very
overload; tests/codegen/test_bindings.py checks that resolution for every entry with a
dispatch mode. Anything else stays the `OpOverload`.
"""

from __future__ import annotations

import torch

from ..devices import runtime_ops  # noqa: F401  (torch.ops.kiln.*, which wrappers call)

_aten = torch.ops.aten
_VF = torch._C._VariableFunctions
_NN = torch._C._nn


def _table() -> dict:
    pairs = [
        (_aten.convolution.default, _VF.convolution),
        (_aten.mm.default, _VF.mm),
        (_aten.mm.out, _VF.mm),
        (_aten.addmm.default, _VF.addmm),
        (_aten.addmm.out, _VF.addmm),
        (_aten.bmm.default, _VF.bmm),
        (_aten.bmm.out, _VF.bmm),
        (_aten.baddbmm.default, _VF.baddbmm),
        (_aten.baddbmm.out, _VF.baddbmm),
        (_aten.max_pool2d_with_indices.default, _NN.max_pool2d_with_indices),
        (_aten.embedding.default, _VF.embedding),
        (_aten.cumsum.default, _VF.cumsum),
    ]
    for name in (
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
    ):
        if hasattr(_aten, name) and hasattr(_VF, name):
            pairs.append((getattr(_aten, name).default, getattr(_VF, name)))
    return dict(pairs)


BINDINGS = _table()

# kiln's own ops whose implementation is a Python function: the wrapper calls that function,
# not the op, whose dispatch (schema parsing, the dispatcher, back into Python) cost several
# times the check itself — each bounds check of embedding or gather indices is one such call.
PLAIN = {runtime_ops.CHECK_INDEX: runtime_ops.check_index}


def fast_binding(op):
    """The binding that calls `op` (see module doc), or `op` itself."""
    return BINDINGS.get(op) or PLAIN.get(op, op)


def fast_externs(externs: dict) -> dict:
    """A wrapper's extern namespace entries with the hot overloads swapped for bindings."""
    return {name: fast_binding(op) for name, op in externs.items()}


def op_names(externs: dict) -> dict[str, str] | None:
    """A wrapper's externs as qualified overload names ("aten::mm.out"), which pickle where
    `OpOverload`s do not; None when one is not an ATen-style overload."""
    out = {}
    for name, op in externs.items():
        if not isinstance(op, torch._ops.OpOverload):
            return None
        out[name] = op.name()
    return out


def resolve_ops(names: dict) -> dict:
    """The `OpOverload`s `op_names` named (an unknown one raises AttributeError); a value that
    is not a name is taken as the op itself."""
    out = {}
    for name, qualified in names.items():
        if not isinstance(qualified, str):
            out[name] = qualified
            continue
        namespace, _, rest = qualified.partition("::")
        op, _, overload = rest.partition(".")
        out[name] = getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")
    return out
