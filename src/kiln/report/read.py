"""Read a trace folder (kiln/trace/writer.py's JSON-lines files) into frames.

Takes a folder; gives a `Trace`: one `Process` per file, each with its compiled frames in the
order they started and the lines it could not read. Reading never fails on a broken run: a torn
or garbled line (a killed writer, a full disk) is counted and skipped, a frame with no end event
(the process died while compiling it) is kept and marked incomplete, and an event of an unknown
kind is ignored, so that a trace from a newer kiln still renders.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Frame:
    id: str
    label: str
    file: str | None = None
    line: int | None = None
    source: str | None = None
    attempt: int = 0
    recompile_reason: str | None = None
    start: float = 0.0
    end: dict[str, Any] | None = None  # the frame_end event; None: the run stopped mid-compile
    breaks: list[dict] = field(default_factory=list)
    logs: dict[str, list[str]] = field(default_factory=dict)
    kernels: list[dict] = field(default_factory=list)  # one per graph: device, kernels, wrapper
    phases: list[dict] = field(default_factory=list)
    cache: list[dict] = field(default_factory=list)

    @property
    def kernel_count(self) -> int:
        return sum(len(g["kernels"]) for g in self.kernels)


@dataclass
class Process:
    path: str
    info: dict[str, Any] = field(default_factory=dict)
    frames: list[Frame] = field(default_factory=list)
    bad_lines: int = 0


@dataclass
class Trace:
    folder: str
    processes: list[Process]

    @property
    def frames(self) -> list[Frame]:
        return [f for p in self.processes for f in p.frames]


def read_trace(folder: str) -> Trace:
    paths = sorted(glob.glob(os.path.join(folder, "kiln-trace-*.jsonl")))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"kiln report: {folder} is not a folder")
    return Trace(folder, [read_process(p) for p in paths])


def read_process(path: str) -> Process:
    proc = Process(path)
    frames: dict[str, Frame] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for text in f:
            try:
                ev = json.loads(text)
                if not isinstance(ev, dict):
                    raise ValueError("not an object")
                _add(proc, frames, ev)
            except (ValueError, TypeError, KeyError, AttributeError):
                proc.bad_lines += 1
    return proc


def _add(proc: Process, frames: dict[str, Frame], ev: dict) -> None:
    kind = ev.get("ev")
    if kind == "process":
        proc.info = ev
        return
    if kind == "frame":
        fr = Frame(
            id=str(ev["frame"]),
            label=str(ev.get("label", "?")),
            file=ev.get("file"),
            line=ev.get("line"),
            source=ev.get("source"),
            attempt=int(ev.get("attempt") or 0),
            recompile_reason=ev.get("recompile_reason"),
            start=float(ev.get("t", 0.0)),
        )
        frames[fr.id] = fr
        proc.frames.append(fr)
        return
    fr = frames.get(str(ev.get("frame")))
    if fr is None:
        return  # an event of a frame whose start was lost: nothing to hang it on
    if kind == "frame_end":
        fr.end = ev
    elif kind == "break":
        fr.breaks.append(ev)
    elif kind == "log":
        fr.logs.setdefault(str(ev["artifact"]), []).append(str(ev["text"]))
    elif kind == "kernels":
        fr.kernels.append(ev)
    elif kind == "phase":
        fr.phases.append(ev)
    elif kind == "cache":
        fr.cache.append(ev)


def stage_times(phases: list[dict]) -> dict[str, float]:
    """Seconds spent in each stage itself, its nested stages' time taken out (a frame's own
    time is capture, guards and the residual program)."""
    own: dict[str, float] = {}
    for p in phases:
        depth, start, end = p.get("depth", 0), p["start"], p["end"]
        inner = p.get("nested", 0.0) + sum(
            q["end"] - q["start"]
            for q in phases
            if q.get("depth", 0) == depth + 1 and q["start"] >= start and q["end"] <= end
        )
        name = "capture" if p["name"] == "frame" else p["name"]
        own[name] = own.get(name, 0.0) + max(0.0, end - start - inner)
    return own
