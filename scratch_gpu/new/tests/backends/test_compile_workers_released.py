"""The inductor backend stops the Triton compile workers once a captured graph is compiled
(triton_builder.shutdown says what idle workers cost a GPU call); the next graph starts
them again. On the CPU no pool starts, so a stand-in takes its place and records being closed."""

from __future__ import annotations

import torch

import kiln
from kiln.runtime import triton_workers


class StandInPool:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


def _f(x, n):
    return torch.relu(x) * n


def test_workers_are_released_after_each_compile(monkeypatch):
    monkeypatch.setattr(triton_workers, "_pool", None)
    compiled = kiln.compile(_f)
    for n in (2, 3):  # a changed Python int recompiles: a second graph
        pool = triton_workers._pool = StandInPool()  # as a GPU graph's prestart leaves it
        x = torch.randn(8)
        torch.testing.assert_close(compiled(x, n), _f(x, n))
        assert pool.closed == 1 and triton_workers._pool is None
    pool = triton_workers._pool = StandInPool()
    x = torch.randn(8)
    torch.testing.assert_close(compiled(x, 3), _f(x, 3))  # a cached entry: nothing compiles
    assert pool.closed == 0
    triton_workers._pool = None
