"""Presenting results: the live table and progress bar, and the JSON, Markdown and PNG files.

Takes result rows (dicts with the fields listed in `FIELDS`) and run metadata; gives text on the
terminal while the run goes, `write_json` (an object with `meta`, `rows` and `skipped`),
`write_markdown` (a table, geomean speedups and notes) and `write_plot` (a bar chart of speedups
over eager, one group per model, one bar per compiler and mode; needs matplotlib, the `bench`
extra).
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import TextIO

FIELDS = (
    "model",
    "compiler",
    "mode",
    "device",
    "dtype",
    "train",
    "correct",
    "compile_s",
    "median_ms",
    "speedup_vs_eager",
    "peak_mem_bytes",
    "graphs",
    "graph_breaks",
    "fallbacks",
)

# (header, width, how to show a row's value)
_COLUMNS = (
    ("model", 16, lambda r: r["model"] + (":train" if r["train"] else "")),
    ("dtype", 8, lambda r: r["dtype"]),
    ("compiler", 8, lambda r: r["compiler"]),
    ("mode", 15, lambda r: r["mode"]),
    ("correct", 7, lambda r: _correct(r)),
    ("compile s", 9, lambda r: _num(r["compile_s"], "{:.2f}")),
    ("ms", 9, lambda r: _num(r["median_ms"], "{:.3f}")),
    ("eager ms", 9, lambda r: _num(r.get("eager_ms"), "{:.3f}")),
    ("speedup", 7, lambda r: _num(r["speedup_vs_eager"], "{:.2f}x")),
    # back-to-back (CUDA): calls in a loop, as training and serving run them; "-" on the CPU
    ("b2b ms", 9, lambda r: _num(r.get("steady_ms"), "{:.3f}")),
    ("b2b x", 6, lambda r: _num(r.get("steady_speedup_vs_eager"), "{:.2f}x")),
    ("peak MiB", 8, lambda r: _num(r["peak_mem_bytes"], "{:.1f}", 1 / 2**20)),
    ("graphs", 6, lambda r: _num(r["graphs"], "{}")),
    ("breaks", 6, lambda r: _num(r["graph_breaks"], "{}")),
    ("fallbacks", 9, lambda r: _num(r.get("fallbacks"), "{}")),
)
# The mark of a correct row with fallbacks: it matched eager, but some of its graphs ran on
# eager kernels, so part of what was measured is not the compiler's code.
FELL_BACK = "yes*"


def _num(value, fmt: str, scale: float = 1.0) -> str:
    return "-" if value is None else fmt.format(value * scale if scale != 1.0 else value)


def _correct(row: dict) -> str:
    if row["correct"] is None:
        return "timeout" if "timed out" in (row.get("error") or "") else "-"
    if not row["correct"]:
        return "NO"
    return FELL_BACK if row.get("fallbacks") else "yes"


def format_header() -> str:
    return "  ".join(f"{h:<{w}}" for h, w, _ in _COLUMNS)


def format_row(row: dict) -> str:
    return "  ".join(f"{show(row):<{w}}" for _, w, show in _COLUMNS)


class Progress:
    """The live view: each finished row printed under a header, and a progress bar redrawn on
    the last line of a terminal (a plain line per task when output is not a terminal)."""

    def __init__(self, total: int, out: TextIO | None = None, width: int = 24):
        self.total, self.done, self.width = total, 0, width
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self.start = time.perf_counter()
        print(format_header(), file=self.out)
        print("-" * len(format_header()), file=self.out, flush=True)

    def _bar(self, label: str) -> str:
        filled = int(self.width * self.done / max(self.total, 1))
        elapsed = time.perf_counter() - self.start
        return (
            f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
            f"{_clock(elapsed)}  {label}"
        )

    def starting(self, label: str) -> None:
        if self.tty:
            self.out.write("\r\033[K" + self._bar(f"running {label}"))
        else:
            self.out.write(f"  ... {self._bar(f'running {label}')}\n")
        self.out.flush()

    def finished(self, row: dict) -> None:
        self.done += 1
        if self.tty:
            self.out.write("\r\033[K")
        print(format_row(row), file=self.out, flush=True)

    def close(self) -> None:
        if self.tty:
            self.out.write("\r\033[K")
        print(
            f"{self.done}/{self.total} rows in {_clock(time.perf_counter() - self.start)}",
            file=self.out,
            flush=True,
        )


def print_table(rows: list[dict], heading: str, out: TextIO | None = None) -> None:
    """The rows under `heading` and the live view's header: the merged rows of a run whose
    live view showed each process's rows (--processes)."""
    out = out or sys.stdout
    print(f"\n{heading}", file=out)
    print(format_header(), file=out)
    print("-" * len(format_header()), file=out)
    for row in rows:
        print(format_row(row), file=out)
    out.flush()


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


def geomean_speedups(rows: list[dict]) -> dict[str, tuple[float, int, int]]:
    """Per `compiler mode`: geometric mean speedup over correct rows, how many rows, and how many
    of them had fallbacks (their speedup is partly eager kernels')."""
    groups: dict[str, list[tuple[float, bool]]] = {}
    for r in rows:
        if r["compiler"] != "eager" and r["correct"] and r["speedup_vs_eager"]:
            key = f"{r['compiler']} {r['mode']}"
            groups.setdefault(key, []).append((r["speedup_vs_eager"], bool(r.get("fallbacks"))))
    return {
        k: (math.exp(sum(math.log(s) for s, _ in v) / len(v)), len(v), sum(f for _, f in v))
        for k, v in groups.items()
    }


def geomean_steady_speedups(rows: list[dict]) -> dict[str, tuple[float, int]]:
    """Per `compiler mode`: geometric mean back-to-back speedup over correct rows that have one
    (CUDA rows), and how many rows."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r["compiler"] != "eager" and r["correct"] and r.get("steady_speedup_vs_eager"):
            groups.setdefault(f"{r['compiler']} {r['mode']}", []).append(
                r["steady_speedup_vs_eager"]
            )
    return {k: (math.exp(sum(map(math.log, v)) / len(v)), len(v)) for k, v in groups.items()}


def compile_time_ratios(rows: list[dict]) -> dict[str, tuple[float, int]]:
    """Per mode: geometric mean of kiln's compile time over torch.compile's, same model."""
    by_key = {(r["model"], r["train"], r["dtype"], r["mode"], r["compiler"]): r for r in rows}
    ratios: dict[str, list[float]] = {}
    for (model, train, dtype, mode, compiler), r in by_key.items():
        t = by_key.get((model, train, dtype, mode, "torch"))
        if compiler == "kiln" and t and r["compile_s"] and t["compile_s"]:
            ratios.setdefault(mode, []).append(r["compile_s"] / t["compile_s"])
    return {k: (math.exp(sum(map(math.log, v)) / len(v)), len(v)) for k, v in ratios.items()}


def summary_lines(rows: list[dict], skipped: list[dict]) -> list[str]:
    lines = []
    for key, (g, n, fell_back) in sorted(geomean_speedups(rows).items()):
        with_fallbacks = f", {fell_back} of them with fallbacks" if fell_back else ""
        lines.append(
            f"geomean speedup over eager, {key}: {g:.2f}x ({n} correct rows{with_fallbacks})"
        )
    for key, (g, n) in sorted(geomean_steady_speedups(rows).items()):
        lines.append(f"geomean back-to-back speedup over eager, {key}: {g:.2f}x ({n} rows)")
    for mode, (g, n) in sorted(compile_time_ratios(rows).items()):
        lines.append(f"kiln compile time / torch.compile's, {mode}: {g:.2f} (geomean, {n} models)")
    for r in rows:
        where = f"{r['model']}{':train' if r['train'] else ''} {r['compiler']} {r['mode']}"
        if r.get("error"):
            lines.append(f"{where}: {_one_line(r['error'])}")
        for reason in r.get("break_reasons") or ():
            lines.append(f"{where}: graph break: {_one_line(reason, 200)}")
        if r.get("fallbacks"):
            first = (r.get("fallback_reasons") or ["(no reason recorded)"])[0]
            lines.append(
                f"{where}: {r['fallbacks']} graph(s) fell back to eager kernels, first: "
                f"{_one_line(first, 200)}"
            )
    for s in skipped:
        lines.append(f"skipped {s['model']}: {s['reason']}")
    return lines


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_json(path: str, rows: list[dict], skipped: list[dict], meta: dict) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows, "skipped": skipped}, f, indent=1)
        f.write("\n")


def markdown_table(rows: list[dict]) -> str:
    head = "| " + " | ".join(h for h, _, _ in _COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in _COLUMNS) + "|"
    body = ["| " + " | ".join(show(r) for _, _, show in _COLUMNS) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def write_markdown(path: str, rows: list[dict], skipped: list[dict], meta: dict) -> None:
    lines = [f"# kiln bench: {meta.get('title', 'results')}", ""]
    lines += [f"- {k}: {_md_value(v)}" for k, v in meta.items() if k != "title"]
    lines += ["", markdown_table(rows), ""]
    notes = summary_lines(rows, skipped)
    if notes:
        lines += [f"- {_one_line(n)}" for n in notes] + [""]
    lines += [
        "ms: the compiler's median; eager ms: eager's median in the same process, timed "
        "interleaved with it; speedup: their ratio. "
        "compile s: first call (compile + run), cold caches, fresh process; peak MiB: see "
        "`kiln.bench.measure` for what is counted on each device. "
        f"fallbacks: graphs that ran on eager kernels because the compiler gave up on them; "
        f"correct `{FELL_BACK}`: matched eager, with fallbacks (partly not the compiler's code)."
        + _processes_note(rows),
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def _processes_note(rows: list[dict]) -> str:
    """The closing paragraph's sentence on rows merged over several processes (--processes)."""
    counts = sorted({r["processes"] for r in rows if r.get("processes")})
    if not counts or counts[-1] == 1:
        return ""
    many = str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    fewer = " (a row's `processes` in the JSON says how many)" if len(counts) > 1 else ""
    return (
        f" Each figure is the median over {many} fresh processes{fewer}, each with cold caches "
        "(speedup: the median of the per-process ratios, each timed within one process; peak "
        "MiB, graphs, breaks and fallbacks: the largest any process saw); the per-process "
        "values are in the JSON (`*_runs`)."
    )


def _md_value(v) -> str:
    return f"`{v}`" if isinstance(v, str) and (" " in v or "-" in v) else str(v)


def write_plot(path: str, rows: list[dict], title: str = "kiln bench") -> None:
    """A grouped bar chart of speedups over eager; wrong results are hatched and marked, rows
    with fallbacks get a `*` after their speedup."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r["compiler"] != "eager" and r["speedup_vs_eager"]]
    models = list(dict.fromkeys(r["model"] + (":train" if r["train"] else "") for r in measured))
    series = list(dict.fromkeys(f"{r['compiler']} {r['mode']}" for r in measured))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(models) + 2), 4.5))
    width = 0.8 / max(len(series), 1)
    for i, name in enumerate(series):
        xs, ys, bad, starred = [], [], [], []
        for r in measured:
            if f"{r['compiler']} {r['mode']}" == name:
                xs.append(models.index(r["model"] + (":train" if r["train"] else "")))
                ys.append(r["speedup_vs_eager"])
                bad.append(not r["correct"])
                starred.append("*" if r.get("fallbacks") else "")
        pos = [x - 0.4 + width * (i + 0.5) for x in xs]
        bars = ax.bar(pos, ys, width, label=name)
        for bar, wrong, star in zip(bars, bad, starred):
            top = (bar.get_x() + bar.get_width() / 2, bar.get_height())
            label = "wrong" if wrong else f"{bar.get_height():.2f}{star}"
            ax.annotate(
                label, top, ha="center", va="bottom", fontsize=6, color="red" if wrong else "black"
            )
            if wrong:
                bar.set_hatch("xx")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(models)), models, rotation=30, ha="right")
    ax.set_ylabel("speedup over eager (x)")
    ax.set_title(title)
    if series:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
