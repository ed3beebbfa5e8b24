"""Loading a cpu graph from its build data: the C++ library and the wrapper's namespace.

Takes the data `CppCodeGen.loadable` gives (C++ source, kernel names with their argument
counts, wrapper source, extern op names, constant tensors); gives the wrapper's `call`. The
library comes from the C++ builder's content-keyed cache (runtime/cpp_builder.py), compiled
only if it is not there.

Why it exists: the build pass of the cpu device, and the warm start's load of a cached graph
(backends/warm.py), are this one function; it imports no lowering, scheduling or rendering
module (sympy alone costs a new process ~0.7 s), so a warm start does not pay for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch

from ... import native
from ...runtime.arenas import new_block
from ...runtime.cpp_builder import build
from ..bindings import fast_externs, resolve_ops
from ..compiled import wrapper_code


def _empty(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


def _fix_input(t: torch.Tensor, name: str, size, stride) -> torch.Tensor:
    """An input whose strides differ from the compiled ones is copied into those strides."""
    if tuple(t.shape) != tuple(size):
        raise RuntimeError(
            f"kiln: input {name} has shape {tuple(t.shape)}, but this graph was compiled for "
            f"{tuple(size)}; recompile for the new shape."
        )
    if t.device.type != "cpu":
        raise RuntimeError(f"kiln: input {name} is on {t.device}; this graph runs on the CPU")
    out = torch.empty_strided(size, stride, dtype=t.dtype, device="cpu")
    out.copy_(t)
    return out


def load(data: Mapping[str, Any]) -> Callable:
    """The wrapper's `call` for `data` (keys: source, kernels, wrapper, externs, constants)."""
    names: dict[str, int] = data["kernels"]
    lib = build(data["source"], names) if names else None
    ns: dict = {
        "torch": torch,
        "_empty": _empty,
        "_as_strided": native.as_strided(),
        "_fix_input": _fix_input,
        "_new_arena": new_block,
        "_arenas": [],  # this graph's arenas between calls (schedule/arena.py)
    }
    for name in names:
        ns[name] = getattr(lib, name)
    ns.update(fast_externs(resolve_ops(data["externs"])))
    ns.update(data["constants"])
    exec(wrapper_code(data), ns)
    native.upgrade_as_strided(ns["call"])  # built before the native module loaded
    return ns["call"]
