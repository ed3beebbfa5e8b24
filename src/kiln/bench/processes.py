"""One benchmark row from several fresh processes: `merge` the rows each process gave.

Takes, for one task, the row list of each process that ran it (`kiln bench --processes N`
runs every task in N fresh worker processes, each with its own empty caches); gives the task's
rows with each figure merged over those processes, and the per-process values kept beside it.

Why: a fresh process's speed is a draw, and it holds for the whole life of the process. On a
16-core H200 host the same eager ResNet-50 program ran, in eight fresh processes, at 3564, 3590,
3761, 5166, 3502, 3529, 4807 and 3599 us of CPU per call: about one process in four is 35-45%
slower from start to end (with ASLR off, 8 of 8 fell in 3289-3815 us, which points at where
the process's memory lands), and the cold compile time varies too. With one process a
row, comparing two compilers' rows, which come from different processes, is a lottery whenever
their true difference is a few percent. The median over N processes drops the unlucky ones.

How each field is merged, and why:
- `compile_s`, `median_ms`, `eager_ms`, `steady_ms`, `eager_steady_ms`: the median over the
  processes that measured it; the per-process values stay in `<field>_runs` (None where a
  process failed), so a reader sees the spread and which process failed.
- `speedup_vs_eager`, `steady_speedup_vs_eager`: the median of the per-process speedups, not a
  ratio of medians: each is eager over compiled timed interleaved within one process, so a
  slow process slows both sides and its ratio stays fair. `speedup_vs_eager_runs` keeps them.
- `peak_mem_bytes`, `max_err`, `graphs`, `graph_breaks`, `fallbacks`: the worst (largest) any
  process saw, since one bad process is a real finding, not noise.
- `correct`: False if any process was wrong, else None if any gave no verdict, else True.
- `error`: each distinct error once, labelled by the process(es) that gave it.
- `break_reasons`, `fallback_reasons`: the union, first-seen order.
- `worker_s`: the sum (the wall time the row cost). `processes`: how many processes were merged.
- anything else (model, compiler, mode, ...): the first process's value.
"""

from __future__ import annotations

import statistics

MEDIANS = (
    "compile_s",
    "median_ms",
    "eager_ms",
    "speedup_vs_eager",
    "steady_ms",
    "eager_steady_ms",
    "steady_speedup_vs_eager",
)
MAXIMA = ("peak_mem_bytes", "max_err", "graphs", "graph_breaks", "fallbacks")
UNIONS = ("break_reasons", "fallback_reasons")
# Fields that name the row: every process's row at one position must agree on them.
_IDENTITY = ("model", "compiler", "mode", "train", "dtype", "device")


def merge(runs: list[list[dict]]) -> list[dict]:
    """The task's rows merged over `runs`, each the row list one process gave (a failed process
    gives `worker.failed_rows`, the same shape); rows keep their order."""
    if not runs:
        raise ValueError("merge: no runs to merge")
    if len({len(rows) for rows in runs}) != 1:
        raise ValueError(f"merge: runs gave different numbers of rows: {[len(r) for r in runs]}")
    return [merge_row([rows[i] for rows in runs]) for i in range(len(runs[0]))]


def merge_row(rows: list[dict]) -> dict:
    """One row from the rows that several processes gave for the same position."""
    for key in _IDENTITY:
        values = {repr(r.get(key)) for r in rows}
        if len(values) > 1:
            raise ValueError(f"merge: processes disagree on {key}: {sorted(values)}")
    merged: dict = {}
    for row in rows:  # the first process's value of each field, in its order
        for key, value in row.items():
            merged.setdefault(key, value)
    for key in MEDIANS:
        values = [r.get(key) for r in rows]
        merged[key] = _median(values)
        merged[f"{key}_runs"] = values
    for key in MAXIMA:
        merged[key] = _max(r.get(key) for r in rows)
    for key in UNIONS:
        merged[key] = list(dict.fromkeys(x for r in rows for x in r.get(key) or ()))
    merged["correct"] = _verdict([r.get("correct") for r in rows])
    merged["error"] = _errors([r.get("error") for r in rows])
    if any("worker_s" in r for r in rows):  # a failed process's row has no worker_s
        merged["worker_s"] = sum(r.get("worker_s") or 0.0 for r in rows)
    merged["processes"] = len(rows)
    return merged


def _median(values: list) -> float | None:
    measured = [v for v in values if v is not None]
    return statistics.median(measured) if measured else None


def _max(values) -> float | int | None:
    measured = [v for v in values if v is not None]
    return max(measured) if measured else None


def _verdict(values: list[bool | None]) -> bool | None:
    if any(v is False for v in values):
        return False
    if any(v is None for v in values):
        return None
    return True


def _errors(errors: list[str | None]) -> str | None:
    """Each distinct error once, prefixed by the processes that gave it (1-based, `of N`)."""
    by_text: dict[str, list[int]] = {}
    for k, error in enumerate(errors, 1):
        if error:
            by_text.setdefault(error, []).append(k)
    n = len(errors)
    lines = []
    for error, which in by_text.items():
        label = "process" if len(which) == 1 else "processes"
        lines.append(f"{label} {', '.join(map(str, which))} of {n}: {error}")
    return "\n".join(lines) or None
