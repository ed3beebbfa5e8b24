"""Tests of kiln.bench.report: JSON, Markdown and PNG outputs are written and well-formed; the
summary figures (geomean speedup, compile-time ratio) are what the rows say."""

from __future__ import annotations

import json
import math

import pytest

from kiln.bench import report


def _row(model, compiler, mode="default", speedup=1.0, compile_s=None, correct=True, **kw):
    row = {
        "model": model,
        "compiler": compiler,
        "mode": mode,
        "device": "cpu",
        "dtype": "float32",
        "train": False,
        "correct": correct,
        "compile_s": compile_s,
        "median_ms": 2.0 / speedup,
        "speedup_vs_eager": speedup,
        "peak_mem_bytes": 3 * 2**20,
        "graphs": 1,
        "graph_breaks": 0,
        "fallbacks": 0 if compiler == "kiln" else None,
        "error": None,
    }
    row.update(kw)
    return row


ROWS = [
    _row("mlp", "eager"),
    _row("mlp", "torch", speedup=2.0, compile_s=10.0),
    _row("mlp", "kiln", speedup=4.0, compile_s=1.0, break_reasons=["call to print at x.py:3"]),
    _row("nanogpt", "eager", train=True),
    _row("nanogpt", "torch", speedup=0.5, compile_s=20.0, train=True),
    _row(
        "nanogpt",
        "kiln",
        speedup=9.0,
        compile_s=5.0,
        train=True,
        correct=False,
        error="wrong result on fresh: output[0]: max |a-b| is 1e-1",
    ),
]
SKIPPED = [{"model": "tv_resnet50", "reason": "needs torchvision (not installed)"}]
META = {"title": "test", "date": "2026-11-21", "command": "kiln bench --models mlp"}


def test_geomean_counts_only_correct_compiled_rows():
    g = report.geomean_speedups(ROWS)
    assert g["torch default"] == (pytest.approx(1.0), 2, 0)
    assert g["kiln default"] == (pytest.approx(4.0), 1, 0)
    assert "eager default" not in g


FELL_BACK_ROW = _row(
    "resnet",
    "kiln",
    speedup=0.9,
    compile_s=1.0,
    fallbacks=2,
    fallback_reasons=["forward: code generation: NotImplementedError: no lowering for x"],
)


def test_a_correct_row_with_fallbacks_is_marked_everywhere(tmp_path):
    rows = [*ROWS, FELL_BACK_ROW]
    assert report.format_row(FELL_BACK_ROW).split()[4] == report.FELL_BACK
    assert report.format_row(ROWS[2]).split()[4] == "yes"  # kiln row without fallbacks
    g = report.geomean_speedups(rows)
    assert g["kiln default"] == (pytest.approx(math.sqrt(4.0 * 0.9)), 2, 1)
    path = tmp_path / "out.md"
    report.write_markdown(str(path), rows, SKIPPED, META)
    text = path.read_text()
    assert f"| resnet | float32 | kiln | default | {report.FELL_BACK} |" in text
    assert "kiln default: 1.90x (2 correct rows, 1 of them with fallbacks)" in text
    assert (
        "resnet kiln default: 2 graph(s) fell back to eager kernels, first: forward: code "
        "generation: NotImplementedError: no lowering for x"
    ) in text
    report.write_json(str(tmp_path / "out.json"), rows, SKIPPED, META)
    saved = json.loads((tmp_path / "out.json").read_text())["rows"][-1]
    assert (
        saved["fallbacks"] == 2 and saved["fallback_reasons"] == FELL_BACK_ROW["fallback_reasons"]
    )


def test_compile_time_ratio_pairs_models():
    ratio, n = report.compile_time_ratios(ROWS)["default"]
    assert n == 2
    assert ratio == pytest.approx(math.sqrt(0.1 * 0.25))


def test_json_is_well_formed(tmp_path):
    path = tmp_path / "out.json"
    report.write_json(str(path), ROWS, SKIPPED, META)
    data = json.loads(path.read_text())
    assert data["meta"] == META
    assert data["skipped"] == SKIPPED
    assert len(data["rows"]) == len(ROWS)
    for row in data["rows"]:
        assert set(report.FIELDS) <= set(row)


def test_markdown_has_a_row_per_result_and_the_notes(tmp_path):
    path = tmp_path / "out.md"
    report.write_markdown(str(path), ROWS, SKIPPED, META)
    text = path.read_text()
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert len(table) == 2 + len(ROWS)
    widths = {ln.count("|") for ln in table}
    assert len(widths) == 1  # every line has the same number of cells
    assert "| nanogpt:train | float32 | kiln | default | NO |" in text
    assert "skipped tv_resnet50: needs torchvision" in text
    assert "geomean speedup over eager, kiln default: 4.00x" in text
    assert "`kiln bench --models mlp`" in text
    assert "mlp kiln default: graph break: call to print at x.py:3" in text


def test_console_row_lines_up_with_header():
    assert len(report.format_row(ROWS[1]).rstrip()) <= len(report.format_header())
    assert "2.00x" in report.format_row(ROWS[1])
    assert " NO " in report.format_row(ROWS[5])


def test_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "out.png"
    report.write_plot(str(path), ROWS)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width = matplotlib.image.imread(str(path)).shape[:2]
    assert width > 400 and height > 300


def test_progress_prints_rows_and_count(capsys):
    import sys

    progress = report.Progress(2, sys.stdout)
    progress.starting("mlp torch default")
    progress.finished(ROWS[1])
    progress.close()
    out = capsys.readouterr().out
    assert "running mlp torch default" in out
    assert report.format_row(ROWS[1]) in out
    assert "1/2 rows" in out


def test_markdown_says_rows_are_medians_over_processes(tmp_path):
    path = tmp_path / "out.md"
    report.write_markdown(str(path), ROWS, SKIPPED, META)
    assert "fresh processes" not in path.read_text()  # one process a row: no note
    report.write_markdown(str(path), [{**r, "processes": 3} for r in ROWS], SKIPPED, META)
    text = path.read_text()
    assert "Each figure is the median over 3 fresh processes, each with cold caches" in text
    assert "speedup: the median of the per-process ratios" in text
    rows = [{**r, "processes": 3} for r in ROWS[:-1]] + [{**ROWS[-1], "processes": 1}]
    report.write_markdown(str(path), rows, SKIPPED, META)
    assert "median over 1 to 3 fresh processes (a row's `processes`" in path.read_text()


def test_back_to_back_geomean_over_rows_that_have_one():
    rows = [
        {"compiler": "kiln", "mode": "default", "correct": True, "steady_speedup_vs_eager": 2.0},
        {"compiler": "kiln", "mode": "default", "correct": True, "steady_speedup_vs_eager": 0.5},
        {"compiler": "kiln", "mode": "default", "correct": True, "steady_speedup_vs_eager": None},
        {"compiler": "kiln", "mode": "default", "correct": False, "steady_speedup_vs_eager": 9.0},
        {"compiler": "eager", "mode": "default", "correct": True, "steady_speedup_vs_eager": 1.0},
    ]
    assert report.geomean_steady_speedups(rows) == {"kiln default": (1.0, 2)}
