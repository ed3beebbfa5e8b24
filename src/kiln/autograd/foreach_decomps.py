"""`torch._foreach_*` ops as one ordinary op per tensor of the list, for the code generator.

Takes nothing; gives `foreach_decompositions()`, which decomps.py registers into kiln's
table: a decomposition for each functional overload of the foreach ops optimizers use
(`_foreach_add.List`, `_foreach_lerp.Scalar`, `_foreach_addcdiv.ScalarList`, ...). Element
`i` of each list argument, and every non-list argument as it is, go to the op of the same
name (`aten.add`), so a foreach update becomes pointwise ops the scheduler fuses per
parameter instead of a chain of opaque extern calls.

Why: an optimizer with `foreach=True` issues one foreach op a line of its update, each kept whole
an extern call that reads and writes every parameter (Adam: about a dozen passes over the
parameters a step); decomposed, the update of each parameter fuses into one loop. Eager's
foreach kernels on the CPU apply the same per-tensor ops, so the values are eager's.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

_UNARY = ("sqrt", "neg", "abs", "exp", "log", "reciprocal", "sigmoid", "sign", "zero", "tanh")
_BINARY = ("add", "sub", "mul", "div", "pow", "clamp_min", "clamp_max", "copy")
_LIST_ONLY = ("maximum", "minimum")  # the Tensor-Tensor op: no Scalar form to map to
_TERNARY = ("lerp", "addcmul", "addcdiv")


def _items(args: tuple, i: int) -> list:
    return [a[i] if isinstance(a, (list, tuple)) else a for a in args]


def _call(name: str, args: list, kwargs: dict):
    if name in ("addcmul", "addcdiv") and len(args) == 4:
        s, t1, t2, v = args
        if isinstance(v, torch.Tensor):  # `.Tensor` overload: a 0-d tensor per element
            scaled = torch.mul(t1, v)
            return torch.add(s, scaled * t2 if name == "addcmul" else scaled / t2)
        return getattr(aten, name)(s, t1, t2, value=v)
    return getattr(aten, name)(*args, **kwargs)


def _decomposition(name: str):
    def decomp(*args, **kwargs):
        n = len(next(a for a in args if isinstance(a, (list, tuple))))
        return [_call(name, _items(args, i), kwargs) for i in range(n)]

    return decomp


WHY = "foreach op: one pointwise op per tensor, fused per parameter by the scheduler"


def foreach_decompositions() -> dict:
    """{overload: decomposition} for every functional overload of the ops above."""
    table = {}
    for name in (*_UNARY, *_BINARY, *_LIST_ONLY, *_TERNARY):
        packet = getattr(aten, f"_foreach_{name}", None)
        if packet is None:
            continue
        for overload in packet.overloads():
            if overload.endswith("out") or name in _LIST_ONLY and overload != "List":
                continue
            table[getattr(packet, overload)] = _decomposition(name)
    return table
