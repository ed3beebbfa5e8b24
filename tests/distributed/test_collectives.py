"""Collectives inside compiled code, 2 processes on gloo: `dist.all_reduce` on a tensor and
the functional collectives give eager's values on every call (none run twice, none skipped,
no hang), are recorded in the graph or are clean graph breaks with a reason, and never make
kiln run the function eagerly (dist_harness turns KilnEagerWarning into an error)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from dist_harness import spawn

import kiln


def in_place_all_reduce(x):
    y = x * 2
    dist.all_reduce(y)
    return y.sin() + 1


def functional_all_reduce(x):
    y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
    return y.cos() * 3


def functional_all_gather(x):
    y = funcol.all_gather_tensor(x + 1, 0, dist.group.WORLD)
    return y.sum(0)


def _collectives(rank, world):
    for backend in ("aot_eager", "inductor"):
        _collectives_with(rank, backend)


def _collectives_with(rank, backend):
    for fn in (in_place_all_reduce, functional_all_reduce, functional_all_gather):
        compiled = kiln.compile(fn, backend=backend)
        for step in range(3):
            g = torch.Generator().manual_seed(10 * step + rank)
            x = torch.randn(4, 5, generator=g)
            torch.testing.assert_close(compiled(x), fn(x), msg=f"{fn.__name__} step {step}")
        report = kiln.explain(fn, backend=backend)(torch.randn(4, 5))
        assert not report.eager_reasons, report
        assert report.graph_count >= 1, report
        for reason, _, _ in report.breaks:
            assert reason, report


def test_collectives_in_compiled_code_match_eager():
    spawn(_collectives)
