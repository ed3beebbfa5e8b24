"""Artifact logs: `KILN_LOGS=graph,guards,...` or `kiln.set_logs(...)`.

Each artifact is a child of the `kiln` logger (`kiln.graph`, `kiln.recompiles`, ...), so the
standard `logging` machinery can redirect them. A message is only formatted when its artifact
is on (or a trace is being recorded: kiln/trace gets every message of a traced compile), so
logging costs nothing when it is off. `once` prints a line a single time per process.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from typing import Callable, Iterable, Iterator

from . import options as _options
from . import trace

ARTIFACTS = (
    "graph",
    "guards",
    "recompiles",
    "graph_breaks",
    "aot_graphs",
    "output_code",
    "schedule",
    "perf_hints",
    "bytecode",
    "fallbacks",
    "passes",
    "capture_cache",
)

_root = logging.getLogger("kiln")
_enabled: set[str] | None = None
_seen_once: set[str] = set()


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        artifact = record.name.split(".", 1)[1] if "." in record.name else "kiln"
        return f"[kiln:{artifact}] {record.getMessage()}"


def _ensure_handler() -> None:
    if not any(getattr(h, "_kiln", False) for h in _root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_Formatter())
        handler._kiln = True  # type: ignore[attr-defined]
        _root.addHandler(handler)
        _root.propagate = False
    if _root.level == logging.NOTSET:
        _root.setLevel(logging.INFO)


def _parse(spec: str | Iterable[str]) -> set[str]:
    names = spec.replace(",", " ").split() if isinstance(spec, str) else list(spec)
    out = set()
    for raw in names:
        name = raw.strip().lstrip("+")
        if not name:
            continue
        if name == "all":
            out.update(ARTIFACTS)
            continue
        if name not in ARTIFACTS:
            raise ValueError(
                f"kiln logs: unknown artifact {name!r}. Known: {', '.join(ARTIFACTS)}, all"
            )
        out.add(name)
    return out


def enabled_artifacts() -> set[str]:
    global _enabled
    if _enabled is None:
        _enabled = _parse(_options.env_logs())
        if _enabled:
            _ensure_handler()
    return _enabled


def set_logs(*names: str, **flags: bool) -> None:
    """`set_logs("graph", "guards")`, `set_logs(graph=True)`, or `set_logs()` to turn all off."""
    global _enabled
    chosen = _parse(names)
    chosen |= _parse([k for k, v in flags.items() if v])
    _enabled = chosen
    if chosen:
        _ensure_handler()


@contextlib.contextmanager
def captured(*names: str) -> Iterator[io.StringIO]:
    """The messages of artifacts `names` logged inside the block, one a line, in the StringIO
    it gives (tests and tools read kiln's decisions this way); the artifacts on before are on
    again after it."""
    global _enabled
    before = set(enabled_artifacts())
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    _root.addHandler(handler)
    set_logs(*names)
    try:
        yield buf
    finally:
        _enabled = before
        _root.removeHandler(handler)


def is_on(artifact: str) -> bool:
    return artifact in enabled_artifacts() or trace.recording()


def log(artifact: str, message: str | Callable[[], str]) -> None:
    """Log `message` under `artifact` if it is on; a callable message is only built when on."""
    if artifact not in ARTIFACTS:
        raise ValueError(f"kiln logs: unknown artifact {artifact!r}")
    shown, traced = artifact in enabled_artifacts(), trace.recording()
    if shown or traced:
        text = message() if callable(message) else message
        if shown:
            logging.getLogger(f"kiln.{artifact}").info(text)
        if traced:  # every message of a traced frame's compile goes into its trace
            trace.log(artifact, text)


def once(key: str, artifact: str, message: str | Callable[[], str]) -> bool:
    """Log a message the first time `key` is seen; True if it was new. A callable message is
    only built when the artifact is on (see `log`)."""
    if key in _seen_once:
        return False
    _seen_once.add(key)
    log(artifact, message)
    return True


def warn(message: str) -> None:
    """A warning the user sees whatever logs are on (limits hit, fallbacks forced on them)."""
    _ensure_handler()
    logging.getLogger("kiln.fallbacks").warning(message)


def warn_once(key: str, message: str) -> None:
    if key not in _seen_once:
        _seen_once.add(key)
        warn(message)
