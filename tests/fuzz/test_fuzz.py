"""Differential fuzzing in CI: a fixed set of random programs (tests/fuzz/generator.py), each
run compiled and eagerly over several calls with outside state changed between calls; every
output, mutated input and piece of outside state must agree (runner.py).

330 programs: most with the "eager" backend (capture, guards, breaks and residuals are what the
fuzzer exercises, and it is the fastest), a slice with "aot_eager" (kiln's AOT autograd) and a
slice with kiln's default code generator. `benchmarks/fuzz.py --count 10000` runs many more.
"""

from __future__ import annotations

import pytest

from .runner import run_many

CHUNK = 25
EAGER_SEEDS = range(0, 250)
AOT_SEEDS = range(10_000, 10_050)
INDUCTOR_SEEDS = range(20_000, 20_030)


def _chunks(seeds, backend):
    seeds = list(seeds)
    return [
        pytest.param(backend, seeds[i : i + CHUNK], id=f"{backend}-{seeds[i]}")
        for i in range(0, len(seeds), CHUNK)
    ]


@pytest.mark.parametrize(
    "backend,seeds",
    _chunks(EAGER_SEEDS, "eager")
    + _chunks(AOT_SEEDS, "aot_eager")
    + _chunks(INDUCTOR_SEEDS, "inductor"),
)
def test_compiled_matches_eager(backend, seeds):
    found = run_many(seeds, backend)
    if found:
        seeds_failed = sorted({m.seed for m in found})
        pytest.fail(
            f"{len(seeds_failed)} of {len(seeds)} programs differ from eager "
            f"(seeds {seeds_failed}); the first:\n{found[0].describe()}"
        )


def test_programs_differ_and_are_deterministic():
    """The generator makes a new program per seed, the same one every time."""
    from .generator import generate

    assert generate(7) == generate(7)
    assert len({generate(s) for s in range(20)}) == 20
