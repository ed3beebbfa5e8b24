"""Tensors whose sizes depend on data: nonzero, masked_select, unique, boolean-mask indexing.

Takes each recorded torch call with its arguments and result; gives which tensors have a shape
the graph cannot promise (such an op's output and everything computed from it), and the
reason for a break when the program reads one of those sizes as a Python number. The graph
holds these ops as they are and, run on new data, they give new sizes; a size read off the
traced call's tensor would be a constant of the graph (`y.view(y.shape[0], 1)`), right for the
traced call only. So that read is a graph break (an error under fullgraph=True, naming the op):
the rest of the call runs with the real size. Ops on these tensors stay in the graph.
"""

from __future__ import annotations

import weakref

import torch
import torch.utils._pytree as pytree

# ops whose output size is a function of their input's values
_OPS = frozenset(
    (
        "nonzero",
        "argwhere",
        "masked_select",
        "unique",
        "unique_consecutive",
        "bincount",
        "_unique",
        "_unique2",
    )
)
SIZE_READS = frozenset(("size", "shape", "numel", "__len__"))
# ops giving as many tensors as a size says (iteration over a tensor is an unbind)
_COUNTED = frozenset(("unbind", "split", "chunk", "tensor_split", "unsafe_split", "hsplit"))


class DataSized:
    """The tensors of a trace whose sizes depend on data, each with the op it came from."""

    def __init__(self) -> None:
        self._origin: dict[int, tuple[weakref.ref, str]] = {}

    def note(self, name: str, label: str, args: tuple, kwargs: dict, out) -> str | None:
        """After a recorded call: mark its outputs if their sizes depend on data. Gives the
        break reason when the number of its outputs does (`unbind`, `split` of such a tensor:
        iterating over one)."""
        if name not in _CANDIDATES and not self._origin:
            return None
        origin = label if _data_sized_call(name, args, kwargs) else None
        if origin is None and self._origin:
            for a in pytree.tree_leaves((args, kwargs)):
                if isinstance(a, torch.Tensor):
                    origin = self.origin(a)
                    if origin is not None:
                        break
        if origin is None:
            return None
        if name in _COUNTED:
            return (
                f"{label} of a tensor computed by {origin}: how many tensors it gives depends "
                "on the data, which a graph cannot hold"
            )
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._origin[id(t)] = (weakref.ref(t), origin)
        return None

    def origin(self, t) -> str | None:
        """The op whose data decided `t`'s size, or None."""
        entry = self._origin.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def size_read(self, name: str, args: tuple) -> str | None:
        """The break reason if this metadata read takes a data-dependent size into Python."""
        if not self._origin or name not in SIZE_READS or not args:
            return None
        origin = self.origin(args[0])
        if origin is None:
            return None
        return (
            f"the size of a tensor computed by {origin} depends on the data; reading it as a "
            "Python number would bake the traced call's size into the graph"
        )


HINT = (
    "keep computing with the tensor itself (its size stays in the graph), or read the size "
    "outside the compiled function"
)
_CANDIDATES = _OPS | {"__getitem__", "where", "repeat_interleave"}


def _data_sized_call(name: str, args: tuple, kwargs: dict) -> bool:
    if name in _OPS:
        return True
    if name == "__getitem__" and len(args) == 2:
        return any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool
            for i in pytree.tree_leaves(args[1])
        )
    if name == "where":  # torch.where(cond): the indices of the true elements
        return len(args) + len(kwargs) == 1
    if name == "repeat_interleave":  # repeats given as a tensor
        reps = args[1] if len(args) > 1 else kwargs.get("repeats")
        return isinstance(reps, torch.Tensor) and reps.numel() > 1 or len(args) == 1
    return False
