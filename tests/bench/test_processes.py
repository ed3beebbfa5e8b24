"""Tests of kiln.bench.processes.merge: a task's rows from several fresh processes become one
set of rows: medians of the timings, the per-process values kept, the worst verdict, errors
labelled by process, counts at their largest and reasons united."""

from __future__ import annotations

import pytest

from kiln.bench import processes, suite, worker
from kiln.bench.measure import base_row

TASK = suite.Task(
    model="mlp",
    compiler="kiln",
    mode="default",
    device="cpu",
    dtype="float32",
    size="tiny",
    train=False,
    models_dir="x",
    with_eager=True,
)


def _run(eager_ms, kiln_ms, compile_s, peak=100, correct=True, error=None, **kiln_fields):
    """The two rows (eager's, kiln's) one process gives for TASK."""
    eager, kiln = worker.failed_rows(TASK, None, None)  # base rows of the right shape
    eager.update(
        correct=True,
        median_ms=eager_ms,
        eager_ms=eager_ms,
        speedup_vs_eager=1.0,
        peak_mem_bytes=peak,
        worker_s=2.0,
    )
    kiln.update(
        correct=correct,
        error=error,
        compile_s=compile_s,
        median_ms=kiln_ms,
        eager_ms=eager_ms,
        speedup_vs_eager=eager_ms / kiln_ms,
        peak_mem_bytes=peak,
        max_err=1e-6,
        graphs=1,
        graph_breaks=0,
        fallbacks=0,
        worker_s=2.0,
    )
    kiln.update(kiln_fields)
    return [eager, kiln]


def test_timings_are_medians_and_the_per_process_values_are_kept():
    # the second process is the slow one: every figure in it is 1.5x
    runs = [_run(4.0, 2.0, 10.0), _run(6.0, 3.0, 15.0), _run(4.2, 2.0, 11.0)]
    eager, kiln = processes.merge(runs)
    assert (kiln["median_ms"], kiln["eager_ms"], kiln["compile_s"]) == (2.0, 4.2, 11.0)
    assert kiln["median_ms_runs"] == [2.0, 3.0, 2.0]
    assert kiln["eager_ms_runs"] == [4.0, 6.0, 4.2]
    assert kiln["compile_s_runs"] == [10.0, 15.0, 11.0]
    # the median of per-process ratios (2.0, 2.0, 2.1), not eager's median over kiln's (2.1)
    assert kiln["speedup_vs_eager"] == 2.0
    assert kiln["speedup_vs_eager_runs"] == [2.0, 2.0, 2.1]
    assert eager["median_ms"] == 4.2 and eager["speedup_vs_eager"] == 1.0
    assert eager["compile_s"] is None and eager["compile_s_runs"] == [None, None, None]
    assert kiln["processes"] == eager["processes"] == 3
    assert kiln["worker_s"] == 6.0  # what the row cost, all processes together
    assert (kiln["model"], kiln["compiler"], eager["compiler"]) == ("mlp", "kiln", "eager")


def test_an_even_count_takes_the_middle_two():
    _, kiln = processes.merge([_run(4.0, 2.0, 10.0), _run(4.0, 4.0, 20.0)])
    assert (kiln["median_ms"], kiln["compile_s"], kiln["speedup_vs_eager"]) == (3.0, 15.0, 1.5)


def test_a_failed_process_is_left_out_of_the_medians_and_named_in_the_error():
    failed = worker.failed_rows(TASK, "timed out after 60 s (worker stopped)", None)
    eager, kiln = processes.merge([_run(4.0, 2.0, 10.0), failed, _run(4.0, 1.0, 12.0)])
    assert kiln["median_ms"] == 1.5 and kiln["compile_s"] == 11.0
    assert kiln["median_ms_runs"] == [2.0, None, 1.0]  # the reader sees which process failed
    assert kiln["speedup_vs_eager"] == 3.0
    assert kiln["correct"] is None and eager["correct"] is None  # one process gave no verdict
    assert kiln["error"] == "process 2 of 3: timed out after 60 s (worker stopped)"
    assert kiln["worker_s"] == 4.0  # a failed process's rows have no worker_s


def test_one_wrong_process_makes_the_row_wrong():
    runs = [
        _run(4.0, 2.0, 10.0, correct=None, error="timed out"),
        _run(4.0, 2.0, 10.0, correct=False, error="wrong result: max |a-b| is 1e-1"),
        _run(4.0, 2.0, 10.0),
    ]
    _, kiln = processes.merge(runs)
    assert kiln["correct"] is False  # False outranks None
    assert kiln["error"] == (
        "process 1 of 3: timed out\nprocess 2 of 3: wrong result: max |a-b| is 1e-1"
    )
    _, kiln = processes.merge([_run(4.0, 2.0, 10.0), _run(4.0, 2.0, 10.0)])
    assert kiln["correct"] is True and kiln["error"] is None


def test_the_same_error_is_given_once_with_every_process_that_gave_it():
    runs = [_run(4.0, 2.0, 10.0, correct=False, error="wrong") for _ in range(3)]
    runs[1] = _run(4.0, 2.0, 10.0)
    _, kiln = processes.merge(runs)
    assert kiln["error"] == "processes 1, 3 of 3: wrong"


def test_memory_errors_and_counts_take_the_largest_and_reasons_are_united():
    runs = [
        _run(4.0, 2.0, 10.0, peak=100, max_err=1e-6, graphs=2, graph_breaks=1, fallbacks=0),
        _run(4.0, 2.0, 10.0, peak=300, max_err=None, graphs=3, graph_breaks=1, fallbacks=None),
        _run(4.0, 2.0, 10.0, peak=200, max_err=1e-4, graphs=2, graph_breaks=2, fallbacks=1),
    ]
    runs[0][1]["break_reasons"] = ["print at a.py:3"]
    runs[1][1]["break_reasons"] = ["print at a.py:3", "data-dependent branch at a.py:9"]
    runs[2][1]["fallback_reasons"] = ["forward: no lowering for x"]
    _, kiln = processes.merge(runs)
    assert kiln["peak_mem_bytes"] == 300 and kiln["max_err"] == 1e-4
    assert (kiln["graphs"], kiln["graph_breaks"], kiln["fallbacks"]) == (3, 2, 1)
    assert kiln["break_reasons"] == ["print at a.py:3", "data-dependent branch at a.py:9"]
    assert kiln["fallback_reasons"] == ["forward: no lowering for x"]
    assert runs[0][1]["break_reasons"] == ["print at a.py:3"]  # the inputs are not changed


def test_counts_nobody_measured_stay_unknown():
    failed = worker.failed_rows(TASK, "worker exited with status 1", False)
    _, kiln = processes.merge([failed, failed])
    assert kiln["graphs"] is kiln["fallbacks"] is kiln["median_ms"] is None
    assert kiln["median_ms_runs"] == [None, None]
    assert kiln["correct"] is False
    assert kiln["error"] == "processes 1, 2 of 2: worker exited with status 1"
    assert "worker_s" not in kiln


def test_one_process_keeps_every_value():
    run = _run(4.0, 2.0, 10.0, break_reasons=["print at a.py:3"])
    merged = processes.merge([run])
    for row, one in zip(run, merged):
        assert {k: one[k] for k in row} == row
        assert one["processes"] == 1 and one["median_ms_runs"] == [row["median_ms"]]


def test_runs_that_do_not_line_up_are_refused():
    with pytest.raises(ValueError, match="different numbers of rows"):
        processes.merge([_run(4.0, 2.0, 10.0), _run(4.0, 2.0, 10.0)[1:]])
    other = [base_row(suite.Task(**{**TASK.to_dict(), "model": "nanogpt"})), _run(1, 1, 1)[1]]
    with pytest.raises(ValueError, match="disagree on model"):
        processes.merge([_run(4.0, 2.0, 10.0), other])
    with pytest.raises(ValueError, match="no runs"):
        processes.merge([])
