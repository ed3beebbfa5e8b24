"""Horizontal fusion (schedule/horizontal.py): independent pointwise kernels over different
shapes become one kernel (C++: one call, one parallel region); a dependent pair, kernels of
other dtypes and groups over the argument cap stay apart, each refusal logged with its reason.
Compiled results are compared with eager on fresh random inputs."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.lower import lower_graph
from kiln.schedule import schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from cg_helpers import check  # noqa: E402


def _logged_schedule(fn, *inputs, **kw):
    records: list[str] = []
    h = logging.Handler()
    h.emit = lambda r: records.append(r.getMessage())  # type: ignore[method-assign]
    logging.getLogger("kiln.schedule").addHandler(h)
    kiln.set_logs("schedule")
    try:
        gm = make_fx(fn)(*inputs)
        return schedule(lower_graph(gm, inputs), verify_ir=True, **kw), records
    finally:
        kiln.set_logs()
        logging.getLogger("kiln.schedule").removeHandler(h)


def _c_kernels(compiled) -> int:
    return len(re.findall(r'extern "C" void kernel\d+', compiled.kernel_source))


def _independent(a, b, c):
    """Three pointwise chains over three sizes, none reading another's result."""
    return (a.sin() * 2 + 1, (b * b).cos() - b, torch.sigmoid(c) * c)


SHAPES = ((37, 19), (300,), (64, 130))


def test_independent_chains_of_different_shapes_are_one_kernel():
    inputs = [torch.randn(s) for s in SHAPES]
    sched, records = _logged_schedule(_independent, *inputs, horizontal=64)
    assert len(sched.kernels) == 1 and len(sched.kernels[0].parts) == 3, str(sched)
    assert any("horizontal group [" in r for r in records), records
    # without the device's cap there is no grouping: one kernel per shape, as before
    assert len(schedule(lower_graph(make_fx(_independent)(*inputs), inputs)).kernels) == 3
    compiled = check(_independent, *inputs)
    assert _c_kernels(compiled) == 1
    assert "omp parallel" not in compiled.kernel_source  # 9323 elements: serial, no threads


def test_large_parts_share_one_parallel_region_and_match_eager():
    # big enough that every part's loop is divided among the threads (omp for nowait)
    shapes = [(256, 300), (70000,), (3, 40000)]
    compiled = check(_independent, *[torch.randn(s) for s in shapes])
    assert _c_kernels(compiled) == 1
    src = compiled.kernel_source
    assert src.count("#pragma omp parallel\n") == 1 and "nowait" in src
    assert "#pragma omp parallel for" not in src


def test_a_dependent_pair_is_not_grouped():
    def fn(x, y):
        a = x.sin() * 3
        b = a.reshape(-1)[:50] + y  # reads a: must run after a's kernel
        return a, b

    inputs = [torch.randn(7, 13), torch.randn(50)]
    sched, records = _logged_schedule(fn, *inputs, horizontal=64)
    assert len(sched.kernels) == 2 and not any(k.parts for k in sched.kernels), str(sched)
    assert any("not grouped" in r and "reads" in r for r in records), records
    check(fn, *inputs)


def test_kernels_of_other_dtypes_form_their_own_groups():
    def fn(a, b, c, d):
        return a * 2, b + 1, c * 3, d - 1

    inputs = [
        torch.randn(30),
        torch.randn(40, dtype=torch.float64),
        torch.randn(50),
        torch.randn(60, dtype=torch.float64),
    ]
    sched, records = _logged_schedule(fn, *inputs, horizontal=64)
    assert sorted(len(k.parts) for k in sched.kernels) == [2, 2], str(sched)
    assert any("differ from the group's" in r for r in records), records
    check(fn, *inputs)


def test_a_group_stays_within_the_argument_cap():
    def fn(*xs):
        return tuple(x * 2 + 1 for x in xs)

    inputs = [torch.randn(10 + i) for i in range(6)]  # six sizes: a read and a write each
    sched, records = _logged_schedule(fn, *inputs, horizontal=4)
    assert [len(k.parts) for k in sched.kernels] == [2, 2, 2], str(sched)
    assert any("more than 4 buffer arguments" in r for r in records), records


def test_no_group_spans_an_extern_call():
    def fn(x, w, y):
        a = x * 2  # before the matmul
        m = a @ w
        return a, m, y.cos()  # y's kernel could run first, but not across the call

    inputs = [torch.randn(8, 16), torch.randn(16, 4), torch.randn(30)]
    sched = _logged_schedule(fn, *inputs, horizontal=64)[0]
    assert not any(k.parts for k in sched.kernels), str(sched)
    check(fn, *inputs)


def test_mutated_inputs_are_still_written_in_place_by_their_part():
    from kiln.codegen import compile_graph_strict

    def fn(p0, p1, g0, g1):
        return p0 - 0.1 * g0, p1 - 0.1 * g1

    shapes = [(33, 17), (51,)]
    make = lambda: [torch.randn(s) for s in shapes * 2]  # noqa: E731
    example = make()
    compiled = compile_graph_strict(make_fx(fn)(*example), example, mutated_inputs={0: 0, 1: 1})
    assert _c_kernels(compiled) == 1
    for _ in range(2):
        args = make()
        expected = fn(*[a.clone() for a in args])
        outs = compiled(list(args))
        for j in range(2):
            assert outs[j] is args[j]
            torch.testing.assert_close(args[j], expected[j])
