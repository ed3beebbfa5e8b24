"""kiln/report: the page of a trace shows its frames, breaks with source lines, recompiles with
the failing guard, kernels with their source and the compile timeline; a broken or partial
trace still renders; `kiln report` says what to do with a wrong folder."""

from __future__ import annotations

import glob
import html
import os
import re
import shutil

from kiln.report import main, read_trace, render, write_report


def test_page_shows_frames_breaks_recompiles_and_kernels(breaks_trace):
    tr = read_trace(breaks_trace)
    page = render(tr)
    # self-contained: nothing to fetch
    assert not re.search(r"<(script|img|link|iframe)[^>]*\s(src|href)=", page)
    frames = tr.frames
    assert len(frames) >= 4
    for fr in frames:
        assert f"data-label='{html.escape(fr.label, quote=True)}'" in page
    assert "if y.sum() &gt; 0:" in page and "class='brk'" in page  # the break's source line
    recompiles = [f for f in frames if f.attempt > 0]
    assert recompiles and all(html.escape(f.recompile_reason) in page for f in recompiles)
    names = [k["name"] for f in frames for g in f.kernels for k in g["kernels"]]
    assert names and all(f"<summary class='kernel-name'>{n}</summary>" in page for n in names)
    assert page.count("class='bar'") == sum(len(f.phases) for f in frames)
    assert re.search(r"id='n-breaks'>[1-9]\d* graph breaks", page)


def test_partial_and_damaged_trace_still_renders(breaks_trace, tmp_path):
    folder = tmp_path / "partial"
    shutil.copytree(breaks_trace, folder)
    (path,) = glob.glob(str(folder / "kiln-trace-*.jsonl"))
    lines = open(path).read().splitlines(keepends=True)
    # the run died while compiling the last frame: its end and everything after it are lost,
    # and the last line was torn in the middle of a write; one line in between is garbled
    last_end = max(i for i, line in enumerate(lines) if '"ev": "frame_end"' in line)
    kept = lines[:3] + ["\x00garbage\n"] + lines[3:last_end] + [lines[last_end][:25]]
    with open(path, "w") as f:
        f.writelines(kept)
    tr = read_trace(str(folder))
    assert tr.processes[0].bad_lines == 2
    assert [f for f in tr.frames if f.end is None]
    out = write_report(str(folder))
    page = open(out).read()
    assert "2 unreadable trace line(s) skipped" in page
    assert "incomplete: the run stopped here" in page


def test_kiln_report_command(breaks_trace, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert main([breaks_trace, "-o", str(out)]) == 0
    assert out.read_text().startswith("<!doctype html>")
    assert main([str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    empty = tmp_path / "empty"
    os.mkdir(empty)
    assert main([str(empty)]) == 0
    assert "No compiled frames" in (empty / "report.html").read_text()
