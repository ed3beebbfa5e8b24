"""Render a `Trace` (read.py) as one self-contained HTML page.

Takes a `Trace`; gives the text of a page with no external resources (inline CSS and a little
inline JavaScript; it opens from a file, offline, years later). The page has a summary, a
timeline of every frame's compile phases, and a section per compiled frame: where it is, why
it recompiled (the failing guard), its source with the graph-break lines marked, the breaks
with their source lines and hints, guards, captured graph, AOT graphs, the schedule with its
fusion decisions, the kernels with their source, compile time by stage and kernel cache hits.
Every text from the trace is HTML-escaped. A script error on the page writes an element with
id `kiln-js-error` into it (tests in a headless browser look for it); a page that finished its
script carries `data-ready="1"` on its body.
"""

from __future__ import annotations

import html
import os

from .read import Frame, Trace, stage_times

STAGE_COLORS = {
    "frame": "#9aa5b1",
    "aot autograd": "#6c8ebf",
    "lower": "#82b366",
    "schedule": "#d6b656",
    "render": "#b85450",
    "build": "#9673a6",
}
# which artifact logs a frame section shows, in order, with their headings
SECTIONS = (
    ("guards", "Guards"),
    ("graph", "Captured graph"),
    ("aot_graphs", "AOT forward / backward graphs"),
    ("schedule", "Schedule and fusion decisions"),
    ("perf_hints", "Performance hints"),
    ("recompiles", "Recompiles"),
    ("fallbacks", "Fallbacks"),
)

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2733;background:#f6f7f9}
header{background:#24313f;color:#fff;padding:14px 22px}
header h1{margin:0 0 6px;font-size:20px}
main{padding:12px 22px}
.stats span{display:inline-block;margin-right:18px}
.frame{background:#fff;border:1px solid #d5dae1;border-radius:6px;margin:14px 0;padding:10px 16px}
.frame h2{font-size:16px;margin:4px 0}
.badge{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;margin-left:6px}
.ok{background:#d9f2dc}.eager{background:#fde8c8}.err{background:#f8d0d0}.inc{background:#e6e0f5}
.rec{background:#dbe8fb}
.where{color:#5b6775;font-family:monospace;font-size:12px}
pre{background:#f1f3f6;padding:8px;overflow:auto;max-height:480px;font-size:12px;margin:4px 0}
.src .ln{color:#8a96a3;user-select:none;display:inline-block;width:4em}
.src>span{display:block;min-height:1.2em}.src .brk{background:#ffe1e1}
details>summary{cursor:pointer;font-weight:600;margin:6px 0}
.break{border-left:4px solid #d9534f;padding:2px 10px;margin:6px 0}
.recompile{border-left:4px solid #4a7bd0;padding:2px 10px;margin:6px 0}
.hint{color:#3c6e3c}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #d5dae1;padding:2px 8px}
.tl{position:relative;height:24px;background:#eef0f3;margin:2px 0 2px 260px}
.tlrow{position:relative}
.tlrow .lab{position:absolute;left:0;width:250px;overflow:hidden;white-space:nowrap;
 text-overflow:ellipsis;font-size:12px;line-height:24px}
.bar{position:absolute;height:7px;min-width:1px;border-radius:2px}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
#filter{margin:8px 0;padding:4px 8px;width:320px}
.hidden{display:none}
"""

JS_ERRORS = """
window.onerror = function (msg, src, line) {
  var d = document.createElement('div'); d.id = 'kiln-js-error';
  d.textContent = 'script error: ' + msg + ' at line ' + line;
  (document.body || document.documentElement).appendChild(d);
};
"""

JS_PAGE = """
(function () {
  var box = document.getElementById('filter');
  box.addEventListener('input', function () {
    var q = box.value.toLowerCase();
    document.querySelectorAll('.frame').forEach(function (s) {
      var hit = s.getAttribute('data-label').toLowerCase().indexOf(q) >= 0;
      s.classList.toggle('hidden', !hit);
    });
  });
  document.body.setAttribute('data-ready', '1');
})();
"""


def esc(text) -> str:
    return html.escape("" if text is None else str(text), quote=True)


def render(trace: Trace) -> str:
    frames = trace.frames
    breaks = sum(len(f.breaks) for f in frames)
    recompiles = sum(1 for f in frames if f.attempt > 0)
    kernels = sum(f.kernel_count for f in frames)
    seconds = sum(p["end"] - p["start"] for f in frames for p in f.phases if p["name"] == "frame")
    bad = sum(p.bad_lines for p in trace.processes)
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>kiln report: {esc(os.path.basename(trace.folder.rstrip('/')))}</title>",
        f"<style>{CSS}</style><script>{JS_ERRORS}</script></head><body>",
        "<header><h1>kiln compile report</h1><div class='stats'>",
        f"<span id='n-frames'>{len(frames)} frames</span>",
        f"<span id='n-breaks'>{breaks} graph breaks</span>",
        f"<span id='n-recompiles'>{recompiles} recompiles</span>",
        f"<span id='n-kernels'>{kernels} kernels</span>",
        f"<span>{seconds:.2f} s compiling</span>",
        f"<span>{len(trace.processes)} process(es)</span></div>",
        f"<div class='where'>{esc(trace.folder)}</div></header><main>",
    ]
    if bad:
        parts.append(
            f"<p class='badge err' id='bad-lines'>{bad} unreadable trace line(s) skipped "
            "(a run that was killed or ran out of disk)</p>"
        )
    if not frames:
        parts.append("<p id='no-frames'>No compiled frames in this trace.</p>")
    parts.append(_processes(trace))
    parts.append(_timeline(trace))
    parts.append("<input id='filter' placeholder='filter frames by name'>")
    for proc in trace.processes:
        for fr in proc.frames:
            parts.append(_frame(fr, proc.info.get("pid", "?")))
    parts.append(f"</main><script>{JS_PAGE}</script></body></html>")
    return "\n".join(parts)


def _processes(trace: Trace) -> str:
    rows = ["<details><summary>Processes</summary><table><tr><th>pid</th><th>command</th>"]
    rows.append("<th>python</th><th>torch</th><th>frames</th><th>file</th></tr>")
    for p in trace.processes:
        i = p.info
        rows.append(
            f"<tr><td>{esc(i.get('pid'))}</td><td>{esc(' '.join(i.get('argv') or []))}</td>"
            f"<td>{esc(i.get('python'))}</td><td>{esc(i.get('torch'))}</td>"
            f"<td>{len(p.frames)}</td><td>{esc(os.path.basename(p.path))}</td></tr>"
        )
    rows.append("</table></details>")
    return "".join(rows)


def _timeline(trace: Trace) -> str:
    """One row per frame, its phases as bars on the process's clock (nested stages lower)."""
    out = ["<h2>Compile timeline</h2><div class='legend'>"]
    out += [f"<span><i style='background:{c}'></i>{esc(n)}</span>" for n, c in STAGE_COLORS.items()]
    out.append("</div><div id='timeline'>")
    for proc in trace.processes:
        spans = [(p["start"], p["end"]) for f in proc.frames for p in f.phases]
        if not spans:
            continue
        t0 = min(s for s, _ in spans)
        total = max(e for _, e in spans) - t0 or 1e-9
        out.append(
            f"<div class='where'>process {esc(proc.info.get('pid', '?'))}: "
            f"{1e3 * total:.0f} ms from its first compile to its last</div>"
        )
        for fr in proc.frames:
            out.append(
                f"<div class='tlrow'><span class='lab' title='{esc(fr.label)}'>"
                f"<a href='#{_anchor(proc, fr)}'>{esc(fr.label)}</a></span><div class='tl'>"
            )
            for p in fr.phases:
                left = 100 * (p["start"] - t0) / total
                width = 100 * (p["end"] - p["start"]) / total
                top = 2 + 5 * min(int(p.get("depth", 0)), 3)
                color = STAGE_COLORS.get(p["name"], "#777")
                tip = f"{p['name']}: {1e3 * (p['end'] - p['start']):.1f} ms"
                out.append(
                    f"<div class='bar' title='{esc(tip)}' style='left:{left:.3f}%;"
                    f"width:{width:.3f}%;top:{top}px;background:{color}'></div>"
                )
            out.append("</div></div>")
    out.append("</div>")
    return "".join(out)


def _anchor(proc_or_pid, fr: Frame) -> str:
    pid = proc_or_pid.info.get("pid", "?") if hasattr(proc_or_pid, "info") else proc_or_pid
    return f"frame-{pid}-{fr.id}"


def _frame(fr: Frame, pid) -> str:
    out = [
        f"<section class='frame' id='{esc(_anchor(pid, fr))}' data-label='{esc(fr.label)}'>",
        f"<h2>{esc(fr.label)}{_status(fr)}</h2>",
        f"<div class='where'>{esc(fr.file)}:{esc(fr.line)}</div>",
    ]
    if fr.attempt > 0:
        out.append(
            f"<div class='recompile'><b>Recompile</b> (entry {fr.attempt + 1}): the guards of "
            f"every earlier entry failed: <code>{esc(fr.recompile_reason)}</code></div>"
        )
    if fr.end and fr.end.get("error"):
        out.append(f"<div class='break'><b>Error:</b> {esc(fr.end['error'])}</div>")
    if fr.end and fr.end.get("eager_reason"):
        out.append(f"<div class='break'><b>Runs eagerly:</b> {esc(fr.end['eager_reason'])}</div>")
    out.append(_source(fr))
    if fr.breaks:
        out.append(f"<details open><summary>Graph breaks ({len(fr.breaks)})</summary>")
        for b in fr.breaks:
            out.append(
                f"<div class='break graph-break'><b>{esc(b.get('reason'))}</b>"
                f"<div class='where'>{esc(b.get('file'))}:{esc(b.get('line'))}</div>"
                f"<pre>{esc(b.get('source_line'))}</pre>"
                + (f"<div class='hint'>hint: {esc(b['hint'])}</div>" if b.get("hint") else "")
                + "</div>"
            )
        out.append("</details>")
    for artifact, title in SECTIONS:
        texts = fr.logs.get(artifact)
        if texts:
            body = "\n\n".join(texts)
            out.append(f"<details><summary>{title}</summary><pre>{esc(body)}</pre></details>")
    out.append(_kernels(fr))
    out.append(_stages(fr))
    if fr.end and fr.end.get("entry_source"):
        out.append(
            "<details><summary>Residual program (the entry's guards and call)</summary>"
            f"<pre>{esc(fr.end['entry_source'])}</pre></details>"
        )
    out.append("</section>")
    return "\n".join(out)


def _status(fr: Frame) -> str:
    badges = []
    if fr.attempt > 0:
        badges.append("<span class='badge rec'>recompile</span>")
    if fr.end is None:
        badges.append("<span class='badge inc'>incomplete: the run stopped here</span>")
    elif fr.end.get("error"):
        badges.append("<span class='badge err'>error</span>")
    elif fr.end.get("eager_reason"):
        badges.append("<span class='badge eager'>runs eagerly</span>")
    else:
        badges.append("<span class='badge ok'>compiled</span>")
    if fr.breaks:
        badges.append(f"<span class='badge eager'>{len(fr.breaks)} break(s)</span>")
    return "".join(badges)


def _source(fr: Frame) -> str:
    if not fr.source:
        return ""
    first = fr.line or 1
    marks = {
        b["line"]: b.get("reason", "")
        for b in fr.breaks
        if b.get("file") == fr.file and b.get("line")
    }
    lines = []
    for i, text in enumerate(fr.source.splitlines()):
        n = first + i
        cls, tip = ("brk", f" title='graph break: {esc(marks[n])}'") if n in marks else ("", "")
        lines.append(f"<span class='{cls}'{tip}><span class='ln'>{n}</span>{esc(text)}</span>")
    body = "".join(lines)  # each line a block of its own
    return f"<details open><summary>Source</summary><pre class='src'>{body}</pre></details>"


def _kernels(fr: Frame) -> str:
    if not fr.kernels:
        return ""
    out = [f"<details><summary>Kernels ({fr.kernel_count})</summary>"]
    for g, graph in enumerate(fr.kernels):
        out.append(f"<p>Graph {g + 1} ({esc(graph.get('device'))})</p>")
        for k in graph.get("kernels", []):
            out.append(
                f"<details class='kernel'><summary class='kernel-name'>{esc(k.get('name'))}"
                f"</summary><pre>{esc(k.get('source'))}</pre></details>"
            )
        out.append(
            f"<details><summary>Wrapper of graph {g + 1}</summary>"
            f"<pre>{esc(graph.get('wrapper'))}</pre></details>"
        )
    out.append("</details>")
    return "".join(out)


def _stages(fr: Frame) -> str:
    if not fr.phases:
        return ""
    own = stage_times(fr.phases)
    rows = "".join(
        f"<tr><td>{esc(name)}</td><td>{1e3 * s:.1f}</td></tr>"
        for name, s in sorted(own.items(), key=lambda kv: -kv[1])
    )
    cache = "".join(
        f"<tr><td>{esc(c.get('kind'))}</td><td>{esc(c.get('result'))}</td>"
        f"<td><code>{esc(c.get('key'))}</code></td></tr>"
        for c in fr.cache
    )
    out = [
        "<details><summary>Compile time by stage</summary><table class='stages'>",
        f"<tr><th>stage</th><th>ms (own)</th></tr>{rows}</table></details>",
    ]
    if cache:
        out.append(
            "<details><summary>Kernel cache</summary><table><tr><th>kind</th><th>result</th>"
            f"<th>key</th></tr>{cache}</table></details>"
        )
    return "".join(out)
