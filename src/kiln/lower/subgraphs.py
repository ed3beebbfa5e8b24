"""Control-flow operators in an ATen graph: `torch.cond` / `while_loop` as extern calls.

Takes a higher-order operator node's target and its lowered arguments (BufRefs for tensors, the
branches' `GraphModule`s as values); gives `SubgraphCall`, the callable an `Extern` names: the
operator with its subgraphs and non-tensor arguments bound, called by the wrapper with the
tensor arguments alone. The branches run as eager ATen subgraphs (the operator's own kernel
picks one, or loops); the code around the operator is compiled as usual.

Why it exists: the wrapper renders an extern call from its target and tensor arguments; a
GraphModule is no value it can write as source text.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.utils._pytree as pytree

from .ir import BufRef

_numbers = itertools.count()

REASON = "control flow: its branches run as eager subgraphs"


class SubgraphCall:
    """`op(*args)` with every BufRef in `args` (nested in lists/tuples) left as a parameter."""

    def __init__(self, op: torch._ops.HigherOrderOperator, args: tuple) -> None:
        leaves, self._spec = pytree.tree_flatten(args)
        self._leaves = leaves
        self._slots = [i for i, v in enumerate(leaves) if isinstance(v, BufRef)]
        self._op = op
        # the wrapper names externs after str(target); each call binds its own branches
        self._name = f"higher_order_{op.name()}_{next(_numbers)}"

    def tensor_args(self) -> tuple[BufRef, ...]:
        return tuple(self._leaves[i] for i in self._slots)

    def __call__(self, *tensors: torch.Tensor) -> Any:
        leaves = list(self._leaves)
        for i, t in zip(self._slots, tensors):
            leaves[i] = t
        return self._op(*pytree.tree_unflatten(leaves, self._spec))

    def __str__(self) -> str:
        return self._name

    __repr__ = __str__
