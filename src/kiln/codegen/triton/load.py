"""Loading a cuda graph from its build data: the Triton module and the wrapper's namespace.

Takes the data `TritonCodeGen.loadable` gives (module source, kernel names and launch plans,
wrapper source, extern op names, constant tensors, the device the wrapper allocates on); gives
the wrapper's `call`, or a `FirstCall` while compile workers still build kernels. The module
comes from the Triton builder's content-keyed cache (runtime/triton_builder.py) and its kernels
from Triton's own cache when they were compiled before.

Why it exists: the build pass of the cuda device, and the warm start's load of a cached graph
(backends/warm.py), are this one function; it imports no lowering, scheduling or rendering
module, so a warm start does not pay for them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Callable

import torch

from ... import native
from ...runtime.triton_builder import compiling, finish_compiles
from ...runtime.triton_builder import load as load_module
from ...runtime.triton_interpret import is_interpreting
from ...runtime.triton_launch import FastKernel
from ..bindings import fast_externs, resolve_ops
from ..compiled import FirstCall, wrapper_code


def load(data: Mapping[str, Any]) -> Callable | FirstCall:
    """The wrapper's `call` for `data` (see the module doc)."""
    kernels = data["kernels"]
    loaded = load_module(data["source"], data["launches"], wait=False) if kernels else None
    device = torch.device(data["device"])
    namespace = _namespace(loaded, kernels, data, device)
    exec(wrapper_code(data), namespace)
    call = namespace["call"]
    native.upgrade_as_strided(call)  # built before the native module loaded
    if loaded is not None and compiling(loaded):
        # the workers compile while the next graph (a training step's forward, compiled
        # after its backward) is lowered; the first call waits for them
        return FirstCall(lambda: finish_compiles(loaded), call)
    return call


def _empty(size, stride, dtype, device):
    return torch.empty_strided(size, stride, dtype=dtype, device=device)


def _take_kept(pool: dict, device, nbytes: int, layouts: tuple) -> tuple:
    """This graph's small intermediates (schedule/arena.py `plan_small_arena`) for a call:
    a set an earlier call on the current stream gave back, or a new one, as (stream, block,
    one view per buffer). Kept per stream: a call's kernels may still be reading its set when
    the wrapper returns, and only a later call on the same stream is sure to run after them."""
    key = torch.cuda.current_stream().cuda_stream if device.type == "cuda" else None
    sets = pool.get(key)
    if sets:
        return sets.pop()
    block = torch.empty(nbytes, dtype=torch.uint8, device=device)
    views = tuple(
        torch.as_strided(block.view(dtype), size, stride, offset)
        for offset, size, stride, dtype in layouts
    )
    return (key, block, *views)


def _give_kept(pool: dict, kept: tuple) -> None:
    pool.setdefault(kept[0], []).append(kept)


def _fix_input(t: torch.Tensor, name: str, size, stride, device=None) -> torch.Tensor:
    """An input with other strides (or on another device) is copied into the compiled ones."""
    if tuple(t.shape) != tuple(size):
        raise RuntimeError(
            f"kiln: input {name} has shape {tuple(t.shape)}, but this graph was compiled for "
            f"{tuple(size)}; recompile for the new shape."
        )
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=device or t.device)
    out.copy_(t)
    return out


INDEX_LIMIT = 2**31 - 1  # the largest element offset a 32-bit kernel index reaches


def _too_large(elements: int):
    raise RuntimeError(
        f"kiln: this call's sizes make a Triton kernel span {elements} elements, past what the "
        "32-bit indices it was compiled with (for the sizes first seen) reach. Fix: call the "
        "compiled function with sizes this large first (after kiln.reset()), so that its kernels "
        "are compiled with 64-bit indices, or mark the dimension static."
    )


def _device_guard(device: torch.device):
    if device.type == "cuda" and device.index is not None:
        if device.index != torch.cuda.current_device():
            return torch.cuda.device(device.index)
    return contextlib.nullcontext()


def _namespace(loaded, kernels: list[str], data: Mapping[str, Any], device) -> dict:
    ns: dict = {
        "torch": torch,
        "_empty": _empty,
        "_take_kept": _take_kept,
        "_give_kept": _give_kept,
        "_kept_sets": {},  # this graph's small intermediates between calls, by stream
        "_as_strided": native.as_strided(),
        "_fix_input": _fix_input,
        "_device_guard": _device_guard,
        "_index_limit": INDEX_LIMIT,
        "_too_large": _too_large,
        "_default_device": device,
        # an int compare per input instead of building a torch.device (-1: the CPU)
        "_device_index": torch.empty(0, device=device).get_device(),
    }
    fast = not is_interpreting()  # the interpreter has no compiled launchers to call
    for name in kernels:
        jit = getattr(loaded, name)
        ns[name] = FastKernel(jit) if fast else jit
    ns.update(fast_externs(resolve_ops(data["externs"])))
    ns.update(data["constants"])
    return ns
