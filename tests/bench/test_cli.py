"""Tests of `kiln bench`'s command line and worker plumbing: argument errors are clear, tasks
cover model x compiler x mode, a worker that hangs or fails becomes a row saying so, and one
end-to-end run of a tiny model writes JSON, Markdown and PNG files."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

import pytest
import torch

from kiln.bench import cli, suite, worker


def _usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as info:
        cli.bench_main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


def test_unknown_model_suggests_the_close_name(capsys):
    err = _usage_error(capsys, ["--models", "mpl"])
    assert "unknown model 'mpl'. Did you mean 'mlp'?" in err
    assert "nanogpt" in err  # the known names are listed


def test_unknown_compiler_and_mode(capsys):
    assert "unknown compiler 'inductor'" in _usage_error(capsys, ["--compilers", "eager,inductor"])
    err = _usage_error(capsys, ["--modes", "reduce_overhead"])
    assert "unknown mode 'reduce_overhead'. Did you mean 'reduce-overhead'?" in err


def test_bad_model_flag_and_empty_lists(capsys):
    assert "unknown flag 'fp32'" in _usage_error(capsys, ["--models", "mlp:fp32"])
    assert "at least one" in _usage_error(capsys, ["--compilers", ","])


def test_bad_numbers_and_choices(capsys):
    assert "--timing-s must be positive" in _usage_error(capsys, ["--timing-s", "0"])
    assert "invalid choice: 'float64'" in _usage_error(capsys, ["--dtype", "float64"])
    assert "invalid choice: 'tpu'" in _usage_error(capsys, ["--suite", "tpu"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_without_cuda(capsys):
    assert "CUDA is not available" in _usage_error(capsys, ["--device", "cuda"])
    assert "CUDA is not available" in _usage_error(capsys, ["--suite", "gpu"])


def test_list_names_every_model(capsys):
    assert cli.bench_main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in suite.load_models(suite.models_dir()):
        assert name in out


def test_tasks_cover_models_compilers_modes():
    entries = (
        suite.Entry("mlp"),
        suite.Entry("nanogpt", train=True, dtype="float32", modes=("default",)),
    )
    tasks = suite.make_tasks(
        entries,
        ("eager", "torch", "kiln"),
        ("default", "reduce-overhead"),
        device="cuda",
        dtype="bfloat16",
        size="large",
        models_path="x",
        timing_s=1.0,
        entry_modes=True,
    )
    labels = [(t.model, t.compiler, t.mode, t.dtype, t.train, t.with_eager) for t in tasks]
    assert labels == [
        ("mlp", "torch", "default", "bfloat16", False, True),
        ("mlp", "torch", "reduce-overhead", "bfloat16", False, False),
        ("mlp", "kiln", "default", "bfloat16", False, False),
        ("mlp", "kiln", "reduce-overhead", "bfloat16", False, False),
        ("nanogpt", "torch", "default", "float32", True, True),
        ("nanogpt", "kiln", "default", "float32", True, False),
    ]
    assert sum(t.rows for t in tasks) == 8  # eager's row once per model


def test_eager_alone_gets_its_own_tasks():
    tasks = suite.make_tasks(
        (suite.Entry("mlp"),),
        ("eager",),
        ("default",),
        device="cpu",
        dtype="float32",
        size="tiny",
        models_path="x",
        timing_s=1.0,
        entry_modes=False,
    )
    assert [(t.compiler, t.with_eager, t.rows) for t in tasks] == [("eager", False, 1)]
    tasks = suite.make_tasks(
        (suite.Entry("mlp"),),
        ("torch",),
        ("default",),
        device="cpu",
        dtype="float32",
        size="tiny",
        models_path="x",
        timing_s=1.0,
        entry_modes=False,
    )
    assert [(t.compiler, t.with_eager) for t in tasks] == [("torch", False)]


def test_flags_reach_the_tasks():
    parser = cli._parser()
    args = parser.parse_args(
        [
            "--models",
            "mlp,nanogpt:train",
            "--compilers",
            "torch",
            "--modes",
            "reduce-overhead",
            "--dtype",
            "bfloat16",
            "--size",
            "tiny",
            "--threads",
            "1",
            "--timing-s",
            "0.5",
            "--seed",
            "3",
        ]
    )
    tasks, skipped, preset, budget = cli.resolve(args, parser)
    assert [(t.model, t.train, t.compiler, t.mode) for t in tasks] == [
        ("mlp", False, "torch", "reduce-overhead"),
        ("nanogpt", True, "torch", "reduce-overhead"),
    ]
    for t in tasks:
        assert (t.device, t.dtype, t.size, t.threads, t.timing_s, t.seed) == (
            "cpu",
            "bfloat16",
            "tiny",
            1,
            0.5,
            3,
        )
    assert skipped == [] and budget == preset.budget_s == suite.SUITES["cpu"].budget_s


def test_train_flag_and_missing_packages():
    parser = cli._parser()
    args = parser.parse_args(["--models", "nanogpt,tv_resnet50", "--train", "--compilers", "eager"])
    tasks, skipped, _, _ = cli.resolve(args, parser)
    assert [(t.model, t.train) for t in tasks] == [("nanogpt", True)]
    if skipped:  # torchvision is not installed here; where it is, the model simply runs
        assert skipped == [
            {"model": "tv_resnet50:train", "reason": "needs torchvision (not installed)"}
        ]


def test_parse_entry_flags():
    known = suite.load_models(suite.models_dir())
    assert suite.parse_entry("nanogpt:train:float32", known) == suite.Entry(
        "nanogpt", train=True, dtype="float32"
    )
    assert suite.parse_entry("mlp", known).label == "mlp"


def test_fresh_cache_env_points_every_cache_at_new_folders(tmp_path):
    env = worker.fresh_cache_env(str(tmp_path))
    paths = [env[name] for name in worker.CACHE_ENV]
    assert len(set(paths)) == 3
    for path in paths:
        assert path.startswith(str(tmp_path)) and os.listdir(path) == []


def _tiny_task(**kw) -> suite.Task:
    fields = dict(
        model="pointwise",
        compiler="eager",
        mode="default",
        device="cpu",
        dtype="float32",
        size="tiny",
        train=False,
        models_dir=str(suite.models_dir()),
        timing_s=0.01,
    )
    fields.update(kw)
    return suite.Task(**fields)


def test_worker_reports_a_model_that_fails_eagerly(tmp_path):
    result = tmp_path / "r.json"
    task = _tiny_task(model="no_such_model", compiler="torch", with_eager=True)
    assert worker.main([json.dumps(task.to_dict()), str(result)]) == 0
    rows = json.loads(result.read_text())
    assert [(r["compiler"], r["correct"]) for r in rows] == [("eager", False), ("torch", False)]
    assert all(r["error"].startswith("eager: KeyError") for r in rows)


def test_worker_past_its_time_limit_is_stopped():
    t0 = time.perf_counter()
    (row,) = worker.run_in_subprocess(_tiny_task(), timeout_s=0.2)
    assert row["error"] == "timed out after 0 s (worker stopped)"
    assert row["correct"] is None
    assert time.perf_counter() - t0 < 30  # it was stopped, not waited for


def test_end_to_end_writes_all_outputs(tmp_path, capsys):
    """One worker process gives eager's row and kiln's, then the three files are written."""
    pytest.importorskip("matplotlib")
    paths = {ext: str(tmp_path / f"out.{ext}") for ext in ("json", "md", "png")}
    argv = ["--models", "softmax_ln", "--compilers", "eager,kiln", "--size", "tiny"]
    argv += ["--threads", "1", "--timing-s", "0.01", "--json", paths["json"]]
    argv += ["--md", paths["md"], "--plot", paths["png"]]
    rc = cli.bench_main(argv)
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads(open(paths["json"]).read())
    rows = data["rows"]
    assert [(r["model"], r["compiler"], r["correct"]) for r in rows] == [
        ("softmax_ln", "eager", True),
        ("softmax_ln", "kiln", True),
    ]
    assert all(r["median_ms"] > 0 and r["peak_mem_bytes"] > 0 for r in rows)
    assert rows[1]["compile_s"] > 0 and rows[1]["speedup_vs_eager"] > 0
    assert data["meta"]["threads"] == 1
    md = open(paths["md"]).read()
    assert "| softmax_ln | float32 | eager | default | yes |" in md
    assert "| softmax_ln | float32 | kiln | default | yes |" in md
    assert open(paths["png"], "rb").read(4) == b"\x89PNG"
    assert "2/2 rows" in out


def test_jobs_run_workers_at_once_and_keep_task_order(capsys):
    models = ("mlp", "softmax_ln", "pointwise")
    tasks = [dataclasses.replace(_tiny_task(), model=m, timing_s=0.01) for m in models]
    rows, skipped = cli.run_tasks(tasks, timeout_s=120, budget_s=0, jobs=2)
    assert not skipped
    assert [(r["model"], r["correct"]) for r in rows] == [(m, True) for m in models]
    assert all(r["median_ms"] > 0 for r in rows)


def test_phase_lock_timing_waits_for_other_workers_compiling(tmp_path):
    from kiln.bench.measure import PhaseLock

    path = str(tmp_path / "timing.lock")
    compiling, timing = PhaseLock(path), PhaseLock(path)
    compiling.shared()
    timing.shared()
    entered = threading.Event()

    def time_it():
        with timing.exclusive():
            entered.set()

    t = threading.Thread(target=time_it)
    t.start()
    assert not entered.wait(0.5)  # the other worker still compiles: no timing yet
    compiling.release()
    assert entered.wait(10)
    t.join()
    timing.release()


def test_processes_must_be_positive(capsys):
    assert "--processes must be positive, got 0" in _usage_error(capsys, ["--processes", "0"])
    assert "--processes must be positive, got -2" in _usage_error(capsys, ["--processes", "-2"])
    assert "invalid int value: '1.5'" in _usage_error(capsys, ["--processes", "1.5"])


def _fake_rows(task: suite.Task, c: int) -> list[dict]:
    """The rows the `c`th call of a fake worker gives: figures that say which call made them
    (compiled c ms, eager 10 c ms, compile 100 + c s, c graphs)."""
    rows = worker.failed_rows(task, None, True)
    for row in rows:
        row.update(median_ms=float(c), eager_ms=10.0 * c, worker_s=1.0)
        row.update(compile_s=None if row["compiler"] == "eager" else 100.0 + c)
        row["speedup_vs_eager"] = row["eager_ms"] / row["median_ms"]
    rows[-1]["graphs"] = c
    return rows


class _FakeWorker:
    """Stands in for worker.run_in_subprocess: records which task each call ran and gives
    `_fake_rows`, after `sleep_s` on the first call."""

    def __init__(self, sleep_s: float = 0.0):
        self.models: list[str] = []
        self.sleep_s = sleep_s

    def __call__(self, task: suite.Task, timeout_s: float) -> list[dict]:
        self.models.append(task.model)
        if len(self.models) == 1:
            time.sleep(self.sleep_s)
        return _fake_rows(task, len(self.models))


def _two_tasks() -> list[suite.Task]:
    return [_tiny_task(model="mlp", compiler="kiln", with_eager=True), _tiny_task(model="nanogpt")]


def test_processes_run_round_robin_and_merge_in_task_order(monkeypatch, capsys):
    fake = _FakeWorker()
    monkeypatch.setattr(worker, "run_in_subprocess", fake)
    rows, skipped = cli.run_tasks(_two_tasks(), timeout_s=60, budget_s=0, processes=3)
    # the first process of each task, then the second of each, then the third
    assert fake.models == ["mlp", "nanogpt"] * 3
    assert skipped == []
    # mlp's runs were calls 1, 3, 5; nanogpt's 2, 4, 6
    assert [(r["model"], r["compiler"]) for r in rows] == [
        ("mlp", "eager"),
        ("mlp", "kiln"),
        ("nanogpt", "eager"),
    ]
    eager, kiln, nanogpt = rows
    assert kiln["median_ms_runs"] == [1.0, 3.0, 5.0] and kiln["median_ms"] == 3.0
    assert kiln["compile_s_runs"] == [101.0, 103.0, 105.0] and kiln["compile_s"] == 103.0
    assert kiln["speedup_vs_eager"] == 10.0 and kiln["graphs"] == 5
    assert eager["compile_s"] is None and eager["median_ms"] == 3.0
    assert nanogpt["median_ms_runs"] == [2.0, 4.0, 6.0] and nanogpt["median_ms"] == 4.0
    assert all(r["processes"] == 3 and r["worker_s"] == 3.0 for r in rows)
    out = capsys.readouterr().out
    assert "running mlp kiln default (+ eager) (process 2/3)" in out
    assert "9/9 rows" in out  # the live view counts each process's rows
    assert "merged: medians over 3 fresh processes" in out
    assert out.rstrip().endswith(cli.report.format_row(nanogpt).rstrip())


def test_one_process_gives_the_workers_rows_unchanged(monkeypatch, capsys):
    fake = _FakeWorker()
    monkeypatch.setattr(worker, "run_in_subprocess", fake)
    tasks = _two_tasks()
    rows, skipped = cli.run_tasks(tasks, timeout_s=60, budget_s=0)
    assert fake.models == ["mlp", "nanogpt"] and skipped == []
    assert rows == _fake_rows(tasks[0], 1) + _fake_rows(tasks[1], 2)  # no merged fields
    assert "merged" not in capsys.readouterr().out


def test_budget_cuts_later_processes_and_the_task_keeps_those_that_ran(monkeypatch):
    # the first run takes the budget below the 30 s a run needs: every later run is skipped
    monkeypatch.setattr(worker, "run_in_subprocess", _FakeWorker(sleep_s=1.1))
    rows, skipped = cli.run_tasks(_two_tasks(), timeout_s=60, budget_s=31, processes=2)
    assert [(r["model"], r["processes"], r["median_ms_runs"]) for r in rows] == [
        ("mlp", 1, [1.0]),
        ("mlp", 1, [1.0]),
    ]
    budget = "time budget of 31 s used up (--budget-s)"
    assert skipped == [
        {"model": "mlp kiln default (+ eager)", "reason": f"ran in 1 of 2 processes: {budget}"},
        {"model": "nanogpt eager default", "reason": budget},
    ]


def test_processes_reach_the_run_and_the_metadata(monkeypatch, tmp_path):
    seen = {}

    def fake_run_tasks(tasks, timeout_s, budget_s, out=None, jobs=1, processes=1):
        seen["processes"] = processes
        return [row for t in tasks for row in _fake_rows(t, 1)], []

    monkeypatch.setattr(cli, "run_tasks", fake_run_tasks)
    path = tmp_path / "out.json"
    argv = ["--models", "mlp", "--compilers", "eager", "--processes", "4", "--json", str(path)]
    assert cli.bench_main(argv) == 0
    assert seen == {"processes": 4}
    assert json.loads(path.read_text())["meta"]["processes"] == 4
