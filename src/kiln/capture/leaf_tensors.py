"""`t.requires_grad_()` inside a trace: a no-op, or a new leaf of autograd (a graph break).

Takes the call as the recording mode meets it; says whether it is handled here. On a tensor
computed from ones that require grad it changes nothing (Hugging Face's gradient checkpointing
calls it on the embeddings' output): no node. On a tensor that does not require grad, with
grad mode on, it makes a new leaf whose `.grad` the program may read after a backward: a graph
cannot hold that (AOT autograd would refuse the whole graph), so it is a graph break, as under
torch.compile: the call runs between graphs, and the rest of the function is compiled with the
tensor as an input that requires grad, its gradient flowing to the leaf.
"""

from __future__ import annotations

import torch

REASON = (
    "Tensor.requires_grad_() makes a tensor made in the graph a leaf of autograd, which a graph "
    "cannot hold"
)
HINT = "make the tensor require grad outside the compiled function and pass it in"


def handled(tracer, args: tuple, kwargs: dict) -> bool:
    """True when the call needs no graph node (a no-op, or done at a break)."""
    t = args[0] if args else None
    wanted = args[1] if len(args) > 1 else kwargs.get("requires_grad", True)
    if not isinstance(t, torch.Tensor) or wanted is not True:
        return False
    if t.requires_grad:
        return t.grad_fn is not None
    if not torch.is_grad_enabled():
        return False
    tracer.graph_break(REASON, HINT)  # raises where the call can be the break's step
    with torch._C.DisableTorchFunction():  # the trace goes on concretely: do it for real
        t.requires_grad_(True)
    return True
