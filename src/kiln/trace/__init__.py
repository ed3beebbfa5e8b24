"""The compile trace: what `options={"trace.enabled": True, "trace.dir": DIR}` writes.

Takes events from one-line hooks in the pipeline: a frame's compile (capture/frontend.py: its
source, the guard that failed when it recompiles, its breaks and guards, how it ended), every
artifact log message (logs.py: captured graph, guards, AOT graphs, schedule and fusion
decisions, output code, graph breaks, perf hints), the kernels each code generator made, timed
stages (`@timed("lower")` and the like) and kernel cache hits. Gives one JSON-lines file per
process in DIR (writer.py), which `kiln report DIR` (kiln/report/) renders.

Which frame an event belongs to: a frame's whole compile (capture, AOT autograd, lowering,
scheduling, code generation, builds) runs synchronously inside capture's call, so this module
keeps a per-thread stack of the frames being compiled and files each event under the innermost,
instead of threading a frame id through every stage's signature. Outside a frame's compile
nothing is recorded, and with no trace enabled every hook is one attribute test.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import re
import threading
from typing import Any, Callable

from .writer import Writer, writer_for

_local = threading.local()
_frame_ids = iter(range(1 << 62))
_ids_lock = threading.Lock()
_WHERE = re.compile(r"^(?P<file>.+?):(?P<line>\d+)")


class _Frame:
    __slots__ = ("id", "writer", "depth", "nested")

    def __init__(self, id_: str, writer: Writer) -> None:
        self.id, self.writer = id_, writer
        self.depth = 1  # the frame's own phase is depth 0, the stages it runs 1 and deeper
        self.nested = 0.0  # seconds spent in frames compiled inside this one (continuations)


def _stack() -> list[_Frame]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def recording() -> bool:
    """Whether this thread is compiling a frame whose options enable the trace."""
    return bool(getattr(_local, "stack", None))


def _emit(ev: str, **fields: Any) -> None:
    stack = getattr(_local, "stack", None)
    if stack:
        frame = stack[-1]
        frame.writer.write({"ev": ev, "frame": frame.id, **fields})


def log(artifact: str, text: str) -> None:
    """An artifact log message (logs.py calls this for every message while recording)."""
    _emit("log", artifact=artifact, text=text)


def event(ev: str, **fields: Any) -> None:
    """A structured event of the frame being compiled (a cache hit, ...); nothing otherwise."""
    if recording():
        _emit(ev, **fields)


def kernels(device: str, module_kernels, wrapper_source: str) -> None:
    """The kernels a code generator made for one graph (objects with `name` and `source`)."""
    if recording():
        rows = [{"name": k.name, "source": k.source} for k in module_kernels]
        _emit("kernels", device=device, kernels=rows, wrapper=wrapper_source)


def timed(stage: str) -> Callable:
    """Decorator: record the wrapped call as a stage of the current frame's compile timeline."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args, **kwargs):
            stack = getattr(_local, "stack", None)
            if not stack:
                return fn(*args, **kwargs)
            frame = stack[-1]
            start = frame.writer.now()
            frame.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                frame.depth -= 1
                _emit("phase", name=stage, start=start, end=frame.writer.now(), depth=frame.depth)

        return run

    return wrap


def compile_frame(cf: Any, trace_dir: str, missed: str | None, run: Callable[[], Any]) -> Any:
    """Run `run()` (capture's compile of the frame `cf`, a capture CompiledFunction) as one
    traced frame: its source and why it recompiled first, then its timeline, breaks, guards and
    how it ended (compiled entries, or why it runs eagerly, or the error it raised)."""
    writer = writer_for(trace_dir)
    with _ids_lock:
        frame = _Frame(f"f{next(_frame_ids)}", writer)
    root = getattr(cf, "root_cf", cf)  # a continuation's breaks are filed on its root
    specs = getattr(cf, "specs", None)  # a continuation runs the rest of its inner function
    file, line, source = _source_of(specs[-1].fn if specs else cf.root_callable)
    breaks_before = len(root.breaks)
    entries_before = len(cf.entries)
    writer.write(
        {
            "ev": "frame",
            "frame": frame.id,
            "label": cf.label,
            "file": file,
            "line": line,
            "source": source,
            "attempt": entries_before,
            "recompile_reason": missed,
        }
    )
    stack = _stack()
    stack.append(frame)
    start = writer.now()
    ok, error = False, None
    try:
        result = run()
        ok = True
        return result
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        for reason, where, hint in root.breaks[breaks_before:]:
            _emit("break", reason=reason, where=where, hint=hint, **_break_place(where))
        end = writer.now()
        _emit("phase", name="frame", start=start, end=end, depth=0, nested=frame.nested)
        stack.pop()
        if stack:  # a continuation compiled on its first call, inside the frame that broke
            stack[-1].nested += end - start
        writer.write(
            {
                "ev": "frame_end",
                "frame": frame.id,
                "ok": ok,
                "error": error,
                "new_entries": len(cf.entries) - entries_before,
                "eager_reason": cf.eager_reason,
                "entry_source": cf.entry_sources[-1] if len(cf.entries) > entries_before else None,
            }
        )


def _source_of(fn: Any) -> tuple[str | None, int | None, str | None]:
    """(file, first line, source text) of a function or a module's forward, where Python has it."""
    target = fn.forward if hasattr(fn, "forward") and not inspect.isfunction(fn) else fn
    target = inspect.unwrap(getattr(target, "__func__", target))
    code = getattr(target, "__code__", None)
    if code is None:
        return None, None, None
    try:
        lines, first = inspect.getsourcelines(target)
        return code.co_filename, first, "".join(lines)
    except (OSError, TypeError):
        return code.co_filename, code.co_firstlineno, None


def _break_place(where: str) -> dict:
    """The file, line and source text a break's `where` ("file:line in fn ...") points at."""
    m = _WHERE.match(where or "")
    if not m:
        return {"file": None, "line": None, "source_line": None}
    file, line = m.group("file"), int(m.group("line"))
    return {"file": file, "line": line, "source_line": linecache.getline(file, line).rstrip()}
