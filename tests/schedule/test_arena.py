"""The arena (schedule/arena.py): intermediates live in one block kept from call to call;
outputs, and buffers an output could be a view of, never do. Every test calls the compiled
graph more than once on fresh random inputs and checks earlier results were not overwritten.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from cg_helpers import check, fresh_like  # noqa: E402


def _mlp(x, w1, b1, w2, b2):
    h = F.relu(F.linear(x, w1, b1))
    y = F.linear(h, w2, b2) + x
    return F.layer_norm(y, (x.shape[-1],)), y * 2


def _mlp_inputs():
    return (
        torch.randn(64, 32),
        torch.randn(128, 32),
        torch.randn(128),
        torch.randn(32, 128),
        torch.randn(32),
    )


def test_intermediates_are_carved_from_one_block_and_outputs_are_not():
    args = _mlp_inputs()
    c = check(_mlp, *args)
    arena = c.schedule.arena
    # (one slot may be enough: relu is stored over the matmul it reads, inplace.py)
    assert arena.nbytes > 0 and len(arena.offsets) >= 1
    outputs = {o for o in c.schedule.graph.outputs if isinstance(o, str)}
    assert not outputs & set(arena.offsets)
    assert "_new_arena(" in c.wrapper_source and "_arenas.append(_arena)" in c.wrapper_source
    # Slots alive at the same step never share bytes.
    for name in arena.offsets:
        assert arena.offsets[name] % 64 == 0


def test_results_of_an_earlier_call_survive_later_calls_and_the_block_is_reused():
    args = _mlp_inputs()
    c = check(_mlp, *args)
    first_args = tuple(fresh_like(a) for a in args)
    first = [t.clone() for t in _mlp(*first_args)]
    got_first = c(*first_args)
    ptrs = set()
    for _ in range(3):
        later = tuple(fresh_like(a) for a in args)
        for got, expected in zip(c(*later), _mlp(*later)):
            torch.testing.assert_close(got, expected)
        ns = c._fn.__globals__
        ptrs.update(a.data_ptr() for a in ns["_arenas"])
    for got, expected in zip(got_first, first):  # still the first call's values
        torch.testing.assert_close(got, expected)
    assert len(ptrs) == 1  # one block, kept and written in place every call


def test_a_buffer_an_extern_returns_a_view_of_stays_out_of_the_block():
    # split is kept as an ATen call that returns views of its input: a chunk returned as an
    # output would point into the block, and the next call would overwrite it.
    def fn(x, w):
        h = (x @ w) * 2
        a, b = torch.split(h, 16, dim=1)
        return a, b.relu() + 1

    args = torch.randn(8, 24), torch.randn(24, 32)
    c = check(fn, *args)
    first_args = tuple(fresh_like(a) for a in args)
    first = [t.clone() for t in fn(*first_args)]
    got_first = c(*first_args)
    c(*(fresh_like(a) for a in args))
    for got, expected in zip(got_first, first):
        torch.testing.assert_close(got, expected)


def test_the_arena_raises_the_peak_by_at_most_its_slack():
    # a and b overlap in time; the output is allocated after both are dead. Both in the arena
    # would hold 2000 bytes beside the output's 1000 (peak 2000 without an arena).
    from kiln.schedule.arena import PEAK_SLACK, _fit

    fixed = [(5, 6, "out", 1024)]
    candidates = [(0, 2, "a", 1024), (1, 3, "b", 1024)]
    arena = _fit(fixed, candidates, 7)
    assert len(arena.offsets) == 1 and arena.nbytes == 1024
    assert arena.nbytes + 1024 <= 2048 * (1 + PEAK_SLACK)
    # Slots that never overlap the output's time or each other share bytes.
    arena = _fit([], [(0, 1, "a", 1024), (2, 3, "b", 1024)], 4)
    assert arena.nbytes == 1024 and arena.offsets == {"a": 0, "b": 0}
