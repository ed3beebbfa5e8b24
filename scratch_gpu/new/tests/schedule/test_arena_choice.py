"""The arena choice (schedule/arena.py `_choose`) that `kiln bench`'s CPU peaks depend on: an
arena within the plan's peak when there is one; otherwise the slack, for large slots only.
(test_measure.py checks the measured peaks against eager's on the suite's models.)
"""

from __future__ import annotations

from kiln.schedule import arena


def _slot(begin, end, name, size):
    return (begin, end, name, size)


def test_an_arena_within_the_peak_is_taken_when_there_is_one():
    # Peaks of 4 MiB at steps 1-2 (b, c) and 6-7 (a, out): a shares bytes with b (or c), and
    # the pair held in one 2 MiB block raises neither peak.
    mib = 1 << 20
    fixed = [_slot(6, 8, "out", 2 * mib)]
    cands = [_slot(5, 7, "a", 2 * mib), _slot(0, 2, "b", 2 * mib), _slot(1, 3, "c", 2 * mib)]
    got = arena._choose(fixed, cands, 8)
    assert len(got.offsets) == 2 and "a" in got.offsets and got.nbytes == 2 * mib
    assert _cost(fixed, cands, got, 8) == _peak(fixed + cands, 8)


def test_slack_is_spent_on_large_slots_only_when_nothing_fits_within_the_peak():
    # "a" overlaps the fixed "f" (the peak, 2 slots); held for the whole call it is also alive
    # beside "out", a tenth larger: any arena raises the peak, by a twentieth.
    for size, expect_held in ((2 << 20, True), (512 << 10, False)):
        fixed = [_slot(1, 3, "f", size), _slot(5, 6, "out", size * 11 // 10)]
        cands = [_slot(0, 2, "a", size)]
        got = arena._choose(fixed, cands, 7)
        assert bool(got.nbytes) == expect_held, size
        if expect_held:  # bought with the slack, and within it
            peak, cost = _peak(fixed + cands, 7), _cost(fixed, cands, got, 7)
            assert peak < cost <= peak * (1 + arena.PEAK_SLACK)


def _live(slots, n):
    out = [0] * (n + 1)
    for begin, end, _, size in slots:
        for t in range(begin, min(end, n) + 1):
            out[t] += size
    return out


def _peak(slots, n):
    return max(_live(slots, n))


def _cost(fixed, cands, got, n):
    """The plan's peak with `got`'s slots held in one block for the whole call."""
    outside = [s for s in cands if s[2] not in got.offsets] + fixed
    return got.nbytes + _peak(outside, n)
