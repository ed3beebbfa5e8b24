"""`kiln report DIR`: one self-contained HTML page from a compile trace.

Takes a folder written by `options={"trace.enabled": True, "trace.dir": DIR}` (kiln/trace/);
gives `DIR/report.html` (or `-o PATH`): frames, graph breaks with their source lines,
recompiles with the failing guard, kernels with their source and a timeline of compile phases.
read.py turns the JSON-lines files into frames (tolerating a broken or partial run); html.py
renders them.
"""

from __future__ import annotations

import os
import sys

from .html import render
from .read import read_trace

__all__ = ["main", "read_trace", "render", "write_report"]


def write_report(folder: str, out: str | None = None) -> str:
    """Render `folder`'s trace to `out` (default `folder/report.html`); gives the page's path."""
    page = render(read_trace(folder))
    out = out or os.path.join(folder, "report.html")
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, out)
    return out


def main(argv: list[str]) -> int:
    usage = "usage: kiln report TRACE_DIR [-o OUT.html]"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    folder, out = argv[0], None
    if len(argv) == 3 and argv[1] in ("-o", "--out"):
        out = argv[2]
    elif len(argv) != 1:
        print(usage, file=sys.stderr)
        return 2
    if not os.path.isdir(folder):
        print(
            f"kiln report: {folder} is not a folder. Write a trace with kiln.compile(..., "
            "options={'trace.enabled': True, 'trace.dir': DIR}), then run kiln report DIR.",
            file=sys.stderr,
        )
        return 2
    path = write_report(folder, out)
    print(f"kiln report: {path}")
    return 0
