"""`kiln bench` and `kiln demo`: parse the command line, run each task in a fresh worker, report.

Takes the arguments after `kiln bench` (see `kiln bench --help`); gives a live table with a
progress bar, optional JSON / Markdown / PNG files, and an exit status: 0 when every row ran and
matched eager, 1 when a compiled result was wrong or a row failed, 2 for a usage error.
`kiln demo` is a short `kiln bench` (four small models, eager vs kiln, on CUDA when present).

A suite preset (`--suite cpu|gpu`, by default the one for `--device`) supplies the models,
compilers, modes, dtype, size, timing and time budget; any flag given explicitly overrides it.
`--processes N` runs each task in N fresh processes and reports the median (processes.py says
why one process a row is not enough to compare compilers).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import os
import platform
import sys
import tempfile
import threading
import time

from . import report, suite
from .processes import merge
from .suite import COMPILERS, DEVICES, DTYPES, MODES, SUITES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kiln bench",
        description="Compare eager, torch.compile and kiln: correctness against eager, cold "
        "compile time, steady-state speed and peak memory, each row in fresh processes.",
        epilog="Model names take flags: NAME[:train][:DTYPE], e.g. nanogpt:train:float32. "
        "Exit status: 0 all rows correct, 1 a wrong result or failed row, 2 usage error.",
    )
    p.add_argument("--models", help="comma-separated model names (default: the suite's)")
    p.add_argument("--compilers", help=f"comma-separated, from {','.join(COMPILERS)}")
    p.add_argument("--modes", help=f"comma-separated, from {','.join(MODES)}")
    p.add_argument("--device", choices=DEVICES, help="default: the suite's, else cpu")
    p.add_argument("--dtype", choices=DTYPES, help="default: the suite's")
    p.add_argument(
        "--train",
        action="store_true",
        help="time training steps (forward + backward), checking gradients too",
    )
    p.add_argument("--suite", choices=tuple(SUITES), help="preset (default: by device)")
    p.add_argument("--size", choices=("tiny", "small", "large"), help="model size preset")
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    p.add_argument("--md", metavar="PATH", help="write a Markdown table")
    p.add_argument("--plot", metavar="PATH", help="write a PNG bar chart of speedups")
    p.add_argument("--timing-s", type=float, help="seconds of interleaved timing per row")
    p.add_argument("--timeout-s", type=float, help="stop a row's worker after this long")
    p.add_argument(
        "--budget-s",
        type=float,
        help="skip rows not started after this many seconds (0: no limit; default: the suite's)",
    )
    p.add_argument(
        "--threads", type=int, help="torch threads in each worker (default: torch's, one per core)"
    )
    p.add_argument(
        "--jobs",
        type=int,
        help="workers running at once (default: the suite's); compile and check phases "
        "overlap, steady-state timing takes turns under a lock",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="fresh worker processes per task, each with cold caches; a row reports the median "
        "over them (default 1: a process's speed is a draw, so compare compilers with 3 or more)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of weights and inputs")
    p.add_argument("--models-dir", help="the benchmarks/models folder to load")
    p.add_argument("--title", help="title of the Markdown file and the chart")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    return p


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """Checked choices: (tasks, skipped models with reasons, the suite used, its budget)."""
    device = args.device
    if args.suite:
        preset = SUITES[args.suite]
    else:
        preset = SUITES["gpu" if device == "cuda" else "cpu"]
    device = device or preset.device
    if device == "cuda" and not _cuda_available():
        import torch

        parser.error(
            f"--device cuda: CUDA is not available (torch {torch.__version__}); use --device cpu"
        )
    try:
        known = suite.load_models(suite.models_dir(args.models_dir))
        if args.models:
            entries = tuple(suite.parse_entry(t, known) for t in args.models.split(",") if t)
            if not entries:
                raise ValueError("--models: give at least one model name")
        else:
            entries = preset.entries
        compilers = (
            suite.parse_choices(args.compilers, COMPILERS, "compilers")
            if args.compilers
            else preset.compilers
        )
        modes = suite.parse_choices(args.modes, MODES, "modes") if args.modes else preset.modes
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    checks = (
        ("--timing-s", args.timing_s),
        ("--timeout-s", args.timeout_s),
        ("--threads", args.threads),
        ("--jobs", args.jobs),
        ("--processes", args.processes),
    )
    for name, value in checks:
        if value is not None and value <= 0:
            parser.error(f"{name} must be positive, got {value}")
    if args.plot and not _has_matplotlib():
        parser.error("--plot needs matplotlib: pip install -e '.[bench]'")
    if args.train:
        entries = tuple(suite.Entry(e.model, True, e.dtype, e.modes) for e in entries)
    entries = tuple(dict.fromkeys(entries))
    skipped = [
        {"model": e.label, "reason": f"needs {', '.join(known[e.model].missing())} (not installed)"}
        for e in entries
        if known[e.model].missing()
    ]
    entries = tuple(e for e in entries if not known[e.model].missing())
    tasks = suite.make_tasks(
        entries,
        compilers,
        modes,
        device=device,
        dtype=args.dtype or preset.dtype,
        size=args.size or preset.size,
        models_path=str(suite.models_dir(args.models_dir)),
        timing_s=args.timing_s or preset.timing_s,
        entry_modes=not args.modes,
        seed=args.seed,
        threads=args.threads,
    )
    budget = preset.budget_s if args.budget_s is None else args.budget_s
    return tasks, skipped, preset, budget


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def run_tasks(
    tasks, timeout_s: float, budget_s: float, out=None, jobs: int = 1, processes: int = 1
) -> tuple[list, list]:
    """Each task in `processes` fresh workers, under the live view; runs not started within the
    budget are skipped. Gives (rows, skipped), rows in task order, each merged over the task's
    runs (`processes.merge`; with one process a task, the worker's rows as they came).

    Runs go round-robin: the first process of every task, then the second of every task, and so
    on, so that a slow spell of the machine falls on one run of many tasks rather than on every
    run of one. A task whose later runs the budget cut off is merged over those that ran, and
    skipped (with the reason) only when none did.

    With `jobs` > 1, that many workers run at once: their start-up, compile and check phases
    overlap (cold compile times then include contention for the CPU, alike for every compiler),
    while a worker's steady-state timing holds a lock exclusively (`measure.PhaseLock`): the
    others wait, outside their own compile or check, until it is done. Process start-up still
    overlaps a timing, so use it where cores are plenty (the GPU suite), not on 2 cores."""
    from .worker import run_in_subprocess

    progress = report.Progress(processes * sum(t.rows for t in tasks), out)
    # runs[i][k]: the rows process k gave for task i; None while (or if never) run.
    runs: list[list[list | None]] = [[None] * processes for _ in tasks]
    budget_used, start, lock = False, time.perf_counter(), threading.Lock()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-lock-") as tmp:
        timing_lock = os.path.join(tmp, "timing.lock") if jobs > 1 else None

        def run(k: int, i: int) -> None:
            nonlocal budget_used
            task = dataclasses.replace(tasks[i], timing_lock=timing_lock)
            left = budget_s - (time.perf_counter() - start) if budget_s else float("inf")
            if left < 30:
                budget_used = True
                return
            label = task.label + (f" (process {k + 1}/{processes})" if processes > 1 else "")
            with lock:
                progress.starting(label)
            rows = run_in_subprocess(task, min(timeout_s, left))
            with lock:
                runs[i][k] = rows
                for row in rows:
                    progress.finished(row)

        order = [(k, i) for k in range(processes) for i in range(len(tasks))]
        with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
            list(pool.map(lambda ki: run(*ki), order))
    progress.close()
    rows, skipped = [], []
    why = f"time budget of {budget_s:.0f} s used up (--budget-s)" if budget_used else ""
    for task, task_runs in zip(tasks, runs):
        ran = [r for r in task_runs if r is not None]
        if not ran:
            skipped.append({"model": task.label, "reason": why})
        elif processes == 1:
            rows += ran[0]  # as one worker gave them: no merged fields
        else:
            rows += merge(ran)
            if len(ran) < processes:
                reason = f"ran in {len(ran)} of {processes} processes: {why}"
                skipped.append({"model": task.label, "reason": reason})
    if processes > 1:  # the live view showed each process's rows; these are what is reported
        heading = f"merged: medians over {processes} fresh processes a row (peak, counts: largest)"
        report.print_table(rows, heading, out)
    return rows, skipped


def _meta(argv: list[str], title: str, tasks, args, jobs: int = 1) -> dict:
    import torch

    import kiln

    device = tasks[0].device if tasks else (args.device or "cpu")
    if device == "cuda":
        name = torch.cuda.get_device_name()
    else:
        name = _cpu_name()
    return {
        "title": title,
        "date": datetime.date.today().isoformat(),
        "command": "kiln bench " + " ".join(argv),
        "machine": f"{name}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "kiln": kiln.__version__,
        "size": tasks[0].size if tasks else args.size,
        "threads": args.threads or f"torch default ({torch.get_num_threads()})",
        "timing_s": tasks[0].timing_s if tasks else args.timing_s,
        "jobs": jobs,
        "processes": args.processes,
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


def bench_main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        known = suite.load_models(suite.models_dir(args.models_dir))
        for name, m in known.items():
            missing = m.missing()
            state = f"  (needs {', '.join(missing)})" if missing else ""
            print(f"{name:<14} {m.description}{state}")
        return 0
    tasks, skipped, preset, budget = resolve(args, parser)
    title = args.title or (f"suite {args.suite}" if args.suite else "custom run")
    for s in skipped:
        print(f"skipping {s['model']}: {s['reason']}")
    if not tasks:
        print("kiln bench: nothing to run", file=sys.stderr)
        return 1
    jobs = args.jobs or preset.jobs
    timeout_s = args.timeout_s or preset.worker_timeout_s
    rows, over = run_tasks(tasks, timeout_s, budget, jobs=jobs, processes=args.processes)
    skipped += over
    for line in report.summary_lines(rows, over):
        print(line)
    meta = _meta(argv, title, tasks, args, jobs)
    rows = [{**r} for r in rows]
    if args.json:
        report.write_json(args.json, rows, skipped, meta)
    if args.md:
        report.write_markdown(args.md, rows, skipped, meta)
    if args.plot:
        report.write_plot(args.plot, rows, title=f"kiln bench: {title} ({meta['date']})")
    for path in (args.json, args.md, args.plot):
        if path:
            print(f"wrote {path}")
    return 1 if any(r["correct"] is not True for r in rows) else 0


def demo_main(argv: list[str]) -> int:
    """Four small models, eager vs kiln, on CUDA when present: correctness and speedup. They are
    the kinds of model kiln speeds up (fused pointwise chains, normalizations, a conv net, a
    small GPT); an MLP whose time is its matmuls gains little, since kiln leaves matmuls to ATen
    (the README says so)."""
    device = "cuda" if _cuda_available() else "cpu"
    print(
        f"kiln demo: compiling four small models with kiln on {device}; each row runs in a "
        "fresh process with cold caches and is checked against eager on fresh random data."
    )
    return bench_main(
        [
            "--models",
            "pointwise,softmax_ln,resnet,nanogpt",
            "--compilers",
            "eager,kiln",
            "--modes",
            "default",
            "--device",
            device,
            "--dtype",
            "float32",
            "--size",
            "small",
            "--timing-s",
            "1",
            "--budget-s",
            "0",
            "--title",
            "kiln demo",
            *argv,
        ]
    )
