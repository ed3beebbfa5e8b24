"""The lowering registry: ATen operator overloads -> functions that build loop IR.

Takes nothing at import beyond the lowering modules that register into it; gives
`register_lowering("add.Tensor", ...)`, a decorator that asserts each name exists in
`torch.ops.aten` (so a typo or an op renamed in a new torch fails at import, loudly, not as a
silent fallback), and `lowering_for(op)`.

A lowering is `fn(ctx, *args, **kwargs) -> value`: tensor arguments arrive as `BufRef`s,
everything else as the Python value in the graph; `ctx` (lower/context.py) adds IR nodes and
knows the output's fake tensor. A lowering raises `Unsupported(reason)` for a case it does not
handle; the op then becomes an `Extern` with that reason.
"""

from __future__ import annotations

from typing import Callable

import torch

_LOWERINGS: dict[torch._ops.OpOverload, Callable] = {}
_VERSIONS: dict[torch._ops.OpOverload, str] = {}


class Unsupported(Exception):
    """A lowering declines this call; the message says why (it reaches KILN_LOGS=perf_hints)."""


def resolve(name: str) -> torch._ops.OpOverload:
    """`"add.Tensor"` -> `torch.ops.aten.add.Tensor`; a name without overload means `.default`."""
    packet_name, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, packet_name, None)
    assert packet is not None, f"register_lowering: torch.ops.aten has no op {packet_name!r}"
    overload = overload or "default"
    assert overload in packet.overloads(), (
        f"register_lowering: aten.{packet_name} has no overload {overload!r} "
        f"(known: {', '.join(packet.overloads())})"
    )
    return getattr(packet, overload)


def register_lowering(
    *names: str, torch_versions: str = ">=2.11"
) -> Callable[[Callable], Callable]:
    """Register one function for several overloads. `torch_versions` records where it applies."""

    resolved = [resolve(name) for name in names]  # fail at the decorator line, not later

    def deco(fn: Callable) -> Callable:
        for op in resolved:
            assert op not in _LOWERINGS, f"register_lowering: {op} is registered twice"
            _LOWERINGS[op] = fn
            _VERSIONS[op] = torch_versions
        return fn

    return deco


def lowering_for(op: torch._ops.OpOverload) -> Callable | None:
    return _LOWERINGS.get(op)


def registered_ops() -> list:
    return sorted(_LOWERINGS, key=str)
