"""kiln/trace: `options={"trace.enabled": True, "trace.dir": DIR}` writes, per compiled frame,
its source, guards, graph breaks with their source lines, the failing guard of a recompile,
captured and AOT graphs, the schedule, kernels with their source, stage timings and cache
events; a write that fails stops the trace, never the program."""

from __future__ import annotations

import glob
import json
import logging
import os

import torch

import kiln
from kiln import trace


def program(x, n):
    y = x.sin() * 2
    if y.sum() > 0:  # a graph break: Python reads a tensor's value
        y = y + 1
    return y.relu() * n


def run_program(folder: str) -> None:
    """Calls that break, recompile on a new constant and on a new shape; checked against eager."""
    compiled = kiln.compile(program, options={"trace.enabled": True, "trace.dir": folder})
    for x, n in ((torch.randn(8, 8), 2), (torch.randn(8, 8), 3), (torch.randn(4, 16), 3)):
        torch.testing.assert_close(compiled(x, n), program(x, n))


def events(folder: str) -> list[dict]:
    files = glob.glob(os.path.join(folder, "kiln-trace-*.jsonl"))
    assert len(files) == 1, files
    with open(files[0]) as f:
        return [json.loads(line) for line in f]


def test_trace_records_each_frame_and_its_artifacts(tmp_path):
    run_program(str(tmp_path))
    evs = events(str(tmp_path))
    assert evs[0]["ev"] == "process" and evs[0]["pid"] == os.getpid()
    frames = [e for e in evs if e["ev"] == "frame"]
    roots = [f for f in frames if f["label"] == "program"]
    assert len(roots) == 3 and "def program(x, n):" in roots[0]["source"]
    assert roots[0]["file"] == __file__ and roots[0]["recompile_reason"] is None
    # recompiles name the guard that failed: the constant n, then the shape of x
    assert "L['n']" in roots[1]["recompile_reason"] and "now 3" in roots[1]["recompile_reason"]
    assert "shape=[4, 16]" in roots[2]["recompile_reason"]
    assert any("resume" in f["label"] for f in frames)  # the continuation after the break
    breaks = [e for e in evs if e["ev"] == "break"]
    assert breaks and all(b["line"] == program.__code__.co_firstlineno + 2 for b in breaks)
    assert "if y.sum() > 0:" in breaks[0]["source_line"] and breaks[0]["hint"]
    ends = [e for e in evs if e["ev"] == "frame_end"]
    assert len(ends) == len(frames) and all(e["ok"] and e["new_entries"] == 1 for e in ends)
    arts = {e["artifact"] for e in evs if e["ev"] == "log"}
    assert {"graph", "guards", "aot_graphs", "schedule", "output_code"} <= arts, arts
    graphs = [e for e in evs if e["ev"] == "kernels"]
    assert graphs and all(g["device"] == "cpu" and g["wrapper"] for g in graphs)
    kernels = [k for g in graphs for k in g["kernels"]]
    assert kernels and all(k["name"] in k["source"] for k in kernels)
    stages = {e["name"] for e in evs if e["ev"] == "phase"}
    assert {"frame", "aot autograd", "lower", "schedule", "render", "build"} <= stages, stages
    for p in (e for e in evs if e["ev"] == "phase"):
        assert 0 <= p["start"] <= p["end"]
    assert {e["result"] for e in evs if e["ev"] == "cache"} <= {"memory", "disk", "compiled"}
    assert any(e["ev"] == "cache" for e in evs)


def test_no_trace_without_the_option(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = kiln.compile(lambda x: x.cos() + 1)
    x = torch.randn(5)
    torch.testing.assert_close(f(x), x.cos() + 1)
    assert not trace.recording() and os.listdir(tmp_path) == []


def test_default_folder_is_kiln_trace_under_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KILN_TRACE_DIR", raising=False)
    f = kiln.compile(lambda x: x.cos() + 1, options={"trace.enabled": True})
    monkeypatch.chdir("/")  # the folder was fixed when the options were built
    x = torch.randn(5)
    torch.testing.assert_close(f(x), x.cos() + 1)
    assert [e["ev"] for e in events(str(tmp_path / "kiln_trace"))][:2] == ["process", "frame"]


def test_a_failing_write_stops_the_trace_not_the_program(tmp_path, monkeypatch):
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger("kiln.fallbacks")
    monkeypatch.setattr(logger, "handlers", [*logger.handlers, handler])
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    folder = str(blocker / "trace")  # cannot be made: its parent is a file (as on a full disk)
    f = kiln.compile(lambda x: x * 3 - 1, options={"trace.enabled": True, "trace.dir": folder})
    for _ in range(2):
        x = torch.randn(6)
        torch.testing.assert_close(f(x), x * 3 - 1)
    assert not os.path.exists(folder)
    assert len([m for m in said if "kiln trace: cannot write" in m]) == 1, said
