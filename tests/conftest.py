"""Suite-wide test setup.

The compiled-artifact cache is off unless a test switches it on (see pytest_configure).

Triton reads `TRITON_INTERPRET` when it is first imported (its own library functions are
decorated then), and any test may import it first (torch.compile does, in interop and
benchmark tests). So the interpreter switch is set here, before collection starts: a default
run (`-m 'not gpu'`, what CI runs) executes generated Triton kernels on CPU tensors in Triton's
interpreter; `pytest -m gpu ...` on the GPU machine compiles them for the GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def pytest_configure(config):
    markexpr = config.getoption("markexpr", "") or ""
    gpu_run = "gpu" in markexpr and "not gpu" not in markexpr
    if not gpu_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    # Compiled graphs are not loaded from the compiled-artifact cache (the warm start): many
    # tests change a compile stage (a monkeypatched pass, a forced failure) and check what it
    # did, which a graph an earlier test compiled would skip. tests/runtime/test_warm_start.py
    # switches it on for its own runs.
    os.environ.setdefault("KILN_ARTIFACT_CACHE", "0")


def pytest_sessionstart(session):
    """Build (once per machine) and load kiln's native guard checks before any test runs, so
    that every compiled function in the suite checks its guard tables the same way. Without
    this, tables made in the first ~15 s would run their Python loops and later ones the C++
    (both are tested: tests/capture/test_guard_tables.py, tests/runtime/test_native.py)."""
    from kiln import native

    native.wait()


@pytest.fixture
def run_python():
    """`run_python(*args, env=None, timeout=600)`: `python *args` in a fresh process (a setting
    read once a process, such as KILN_NATIVE, or a script that must not import what the test
    did); fails the test with the end of its stderr unless it exits 0, and gives the finished
    process (`.stdout`, `.stderr`)."""

    def run(*args: str, env: dict | None = None, timeout: float = 600):
        out = subprocess.run(
            [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return out

    return run


@pytest.fixture
def perf_hints():
    """perf_hints switched on, its messages collected (the list is the fixture's value); the
    logging state restored after. (kiln is imported here, after `pytest_configure` has set
    Triton's interpreter up.)"""
    import logging

    import kiln
    from kiln import logs

    saved = (logs._enabled, list(logging.getLogger("kiln").handlers))

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages: list[str] = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    keep = Keep()
    hints = logging.getLogger("kiln.perf_hints")
    hints.addHandler(keep)
    kiln.set_logs("perf_hints")
    yield keep.messages
    hints.removeHandler(keep)
    logs._enabled = saved[0]
    logging.getLogger("kiln").handlers[:] = saved[1]
