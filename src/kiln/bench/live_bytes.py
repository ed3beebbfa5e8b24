"""Live tensor memory seen through a dispatch mode: bytes of new storages alive, and their peak.

Takes whatever runs while the mode is on; gives `now` (bytes of the storages its ATen ops made
that are still alive) and `peak` (the most at once). Each new storage (by its data pointer) is
counted once and dropped when its Python storage object dies (torch keeps one such object per
storage, so a weak reference to it lives as long as the memory). An output on the storage of
one of the op's inputs (a view, an `out=` call, an in-place op) is no new memory: a block made
before the mode (a parameter, kiln's arena kept from the last call) is not counted when an op
views it. `counts(t)` chooses the tensors counted (default: every tensor).

Why: the CPU has no allocator statistics per tensor; the memory benchmark
(benchmarks/memory_breakdown.py) and the memory tests (tests/autograd/test_saved_memory.py,
tests/e2e/test_training_memory.py) compare eager's peak with a compiled call's this way.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _any_tensor(t: Any) -> bool:
    return isinstance(t, torch.Tensor)


class LiveBytes(TorchDispatchMode):
    """See the module doc."""

    def __init__(self, counts: Callable[[Any], bool] = _any_tensor) -> None:
        super().__init__()
        self.counts = counts
        self.live: dict[int, int] = {}
        self.now = 0
        self.peak = 0

    def _drop(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        counts = self.counts
        given = {
            t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs or {})) if counts(t)
        }
        for t in tree_leaves(out):
            if not counts(t):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in self.live or key in given or storage.nbytes() == 0:
                continue
            self.live[key] = storage.nbytes()
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
            weakref.finalize(storage, self._drop, key)
        return out
