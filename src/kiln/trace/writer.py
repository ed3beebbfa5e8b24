"""The trace file: one JSON object a line, appended and flushed event by event.

Takes event dicts; gives `DIR/kiln-trace-<pid>-<start>.jsonl`, one file per process and
folder (several processes may trace into one folder; `kiln report` merges them). Each event is
written with one `write` of a whole line and flushed at once, so a run that crashes or is
killed leaves every earlier event readable and at most one torn last line, which the reader
(kiln/report/read.py) skips. The first line says which process wrote the file and when it
started; times in later events are seconds since then. A write that fails (a full disk, a
removed folder) turns that file's tracing off with one warning: the user's program goes on.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Any

_writers: dict[str, "Writer"] = {}
_lock = threading.Lock()


class Writer:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.start = time.perf_counter()
        self._lock = threading.Lock()
        self.path = os.path.join(folder, f"kiln-trace-{os.getpid()}-{int(time.time() * 1e3)}.jsonl")
        self._file = None
        self.broken = False
        import torch

        self.write(
            {
                "ev": "process",
                "pid": os.getpid(),
                "argv": list(sys.argv),
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "wall_start": time.time(),
            }
        )

    def now(self) -> float:
        return round(time.perf_counter() - self.start, 6)

    def write(self, event: dict[str, Any]) -> None:
        if self.broken:
            return
        event.setdefault("t", self.now())
        line = json.dumps(event, default=repr, ensure_ascii=False) + "\n"
        with self._lock:
            try:
                if self._file is None:
                    os.makedirs(self.folder, exist_ok=True)
                    self._file = open(self.path, "a", encoding="utf-8")
                self._file.write(line)
                self._file.flush()
            except OSError as e:
                self.broken = True
                # through `logging` (the `kiln.fallbacks` logger logs.warn uses): logs imports
                # this package, so this one does not import logs
                logging.getLogger("kiln.fallbacks").warning(
                    f"kiln trace: cannot write {self.path} ({e}); tracing stops there."
                )


def writer_for(folder: str) -> Writer:
    """The process's writer for `folder` (one file each), made on first use."""
    folder = os.path.abspath(folder)
    with _lock:
        w = _writers.get(folder)
        if w is None:
            w = _writers[folder] = Writer(folder)
        return w
