"""Activation checkpointing inside a trace: `torch.utils.checkpoint.checkpoint(fn, *args)`.

Takes the call as the interpreter meets it (directly, or through a `functools.partial` as
Hugging Face models make it); gives `fn(*args)`, traced inline like any call, with every graph
node the region records marked `meta["recompute"] = True`. AOT autograd's partitioner
(autograd/partition.py) saves none of those values for the backward: it recomputes the region
there from the region's inputs, which is what checkpointing does in eager, in one graph.

Both forms (`use_reentrant=False`, and the reentrant one) compute the same values and gradients
for what a compiled region can hold; random ops inside the region are not marked, so their
values (a dropout mask) are saved and the backward sees the forward's, as eager's RNG-state
replay gives. A call with options kiln does not model (`context_fn`, a `determinism_check` or
`debug` other than the defaults) runs torch's own implementation, inlined as any library code.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch.utils.checkpoint import CheckpointPolicy

CHECKPOINT = torch_checkpoint.checkpoint

_DEFAULTS = {
    "context_fn": torch_checkpoint.noop_context_fn,
    "determinism_check": torch_checkpoint._DEFAULT_DETERMINISM_MODE,
    "debug": False,
    "preserve_rng_state": True,
    "early_stop": True,
}


def modelled(kwargs: dict) -> bool:
    """Whether kiln's reading of the call covers these options."""
    return all(
        kwargs[k] is v or kwargs[k] == v for k, v in _DEFAULTS.items() if k in kwargs
    ) and kwargs.get("use_reentrant") in (None, True, False)


def run_checkpointed(interp, args: tuple, kwargs: dict, call) -> Any:
    """`checkpoint(fn, *args, **kwargs)`: `fn` traced by `call(fn, args, kwargs)`, its nodes
    marked for recomputation."""
    kwargs = dict(kwargs)
    use_reentrant = kwargs.pop("use_reentrant", None)
    for k in _DEFAULTS:
        kwargs.pop(k, None)
    if use_reentrant is None:
        warnings.warn(  # torch's own words, at the caller's line as torch gives them
            "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. "
            "use_reentrant=False is recommended.",
            stacklevel=2,
        )
    fn, fn_args = args[0], args[1:]
    if use_reentrant and kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    graph = interp.tracer.graph
    before = set(graph.nodes) if interp.tracer.recording else None
    out = call(fn, fn_args, kwargs)
    if before is not None and interp.tracer.recording:
        # each region gets its own number (torch's `ac_graph_id`, which make_fx copies with the
        # mark): a value one region gives the next is the next region's input, saved as eager
        # saves a checkpoint's inputs, not recomputed from the first region on
        region = 1 + max((n.meta.get("ac_graph_id", 0) for n in before), default=0)
        for node in graph.nodes:
            if node not in before and node.op in ("call_function", "call_method"):
                # torch's own mark (FX prints and checks it as a CheckpointPolicy)
                node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
                node.meta["ac_graph_id"] = region
    return out


__all__ = ["CHECKPOINT", "modelled", "run_checkpointed", "torch"]
