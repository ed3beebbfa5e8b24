"""One benchmark task in a fresh process: the runner's side (`run_in_subprocess`) and the
worker's (`python -m kiln.bench.worker TASK_JSON RESULT_PATH`).

Takes a `Task`; gives its result rows: the compiled model's, preceded by eager's when the task
carries it (suite.make_tasks). Each task runs in a new Python process whose kiln, Inductor and
Triton caches point into a new, empty temporary folder (`KILN_CACHE_DIR`,
`TORCHINDUCTOR_CACHE_DIR`, `TRITON_CACHE_DIR`), so the compile time measured is a cold one and
no task's compiled code or process state leaks into another's. A worker that crashes or runs
past its time limit becomes rows saying so, with the tail of its stderr.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .suite import Task

CACHE_ENV = ("KILN_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def fresh_cache_env(root: str) -> dict[str, str]:
    """The environment of a worker: this one's, with every compiler cache under `root`."""
    env = dict(os.environ)
    for name in CACHE_ENV:
        path = os.path.join(root, name.lower())
        os.makedirs(path, exist_ok=True)
        env[name] = path
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_in_subprocess(task: Task, timeout_s: float) -> list[dict]:
    """Run `task` in a fresh worker process with fresh caches; always gives its rows."""
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as root:
        result_path = os.path.join(root, "result.json")
        stderr_path = os.path.join(root, "stderr.txt")
        cmd = [sys.executable, "-m", "kiln.bench.worker", json.dumps(task.to_dict()), result_path]
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                cmd,
                env=fresh_cache_env(os.path.join(root, "cache")),
                stdout=err,
                stderr=err,
                start_new_session=True,  # its own process group, so a timeout stops its children
            )
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _stop(proc)
                return failed_rows(
                    task, f"timed out after {timeout_s:.0f} s (worker stopped)", None
                )
        if rc == 0 and os.path.exists(result_path):
            with open(result_path) as f:
                return json.load(f)
        return failed_rows(task, f"worker exited with status {rc}: {_tail(stderr_path)}", False)


def failed_rows(task: Task, error: str, correct: bool | None) -> list[dict]:
    """The rows of a task that gave no result (eager's first, when the task owed it)."""
    from .measure import base_row

    tasks = [task]
    if task.with_eager:
        tasks.insert(0, dataclasses.replace(task, compiler="eager", mode="default"))
    return [{**base_row(t), "correct": correct, "error": error} for t in tasks]


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _tail(path: str, chars: int = 1500) -> str:
    text = Path(path).read_text(errors="replace").strip()
    lines = [ln for ln in text.splitlines() if not ln.startswith("USDT:")]  # profiler chatter
    return "\n".join(lines)[-chars:] or "(no output)"


def json_safe(row: dict) -> dict:
    """Infinite or NaN floats (an unbounded error ratio, say) become None: JSON has no inf."""
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()
    }


def main(argv: list[str]) -> int:
    task = Task(**json.loads(argv[0]))
    result_path = argv[1]
    from .measure import COMPILERS, run_task
    from .suite import load_models

    if task.threads:
        import torch

        torch.set_num_threads(task.threads)
    t0 = time.perf_counter()
    try:
        bench_model = load_models(task.models_dir)[task.model]
        rows = run_task(task, bench_model, COMPILERS[task.compiler])
    except Exception as exc:  # the model itself failed to build or run eagerly
        rows = failed_rows(task, f"eager: {type(exc).__name__}: {exc}"[:2000], False)
    for row in rows:
        row["worker_s"] = time.perf_counter() - t0
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump([json_safe(row) for row in rows], f)
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
