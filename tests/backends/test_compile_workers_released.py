"""The inductor backend stops the Triton compile workers once a captured graph is compiled
(triton_builder.shutdown says what idle workers cost a GPU call); the next graph starts
them again. On the CPU no pool starts, so a stand-in takes its place and records being closed."""

from __future__ import annotations

import torch

import kiln
from kiln.runtime import triton_workers


class StandInPool:
    def __init__(self):
        self.closed = 0
        self.waited = None

    def close(self, wait=True):
        self.closed += 1
        self.waited = wait


def _f(x, n):
    return torch.relu(x) * n


def test_workers_are_released_after_each_compile(monkeypatch):
    monkeypatch.setattr(triton_workers, "_pool", None)
    compiled = kiln.compile(_f)
    for n in (2, 3):  # a changed Python int recompiles: a second graph
        pool = triton_workers._pool = StandInPool()  # as a GPU graph's prestart leaves it
        x = torch.randn(8)
        torch.testing.assert_close(compiled(x, n), _f(x, n))
        assert pool.closed == 1 and triton_workers._pool is None
        assert pool.waited is False  # the call does not wait for the workers to exit
    pool = triton_workers._pool = StandInPool()
    x = torch.randn(8)
    torch.testing.assert_close(compiled(x, 3), _f(x, 3))  # a cached entry: nothing compiles
    assert pool.closed == 0
    triton_workers._pool = None


def test_closing_without_waiting_still_reaps_the_workers():
    """`close(wait=False)` returns at once; the workers, told to exit, are reaped behind it."""
    import os
    import selectors
    import subprocess
    import sys
    import tempfile
    import time

    pool = object.__new__(triton_workers.WorkerPool)  # its processes made here, not the script
    pool._sel = selectors.DefaultSelector()
    pool._claims = tempfile.mkdtemp()  # the launcher-claims folder, removed once reaped
    slow_exit = "import sys, time; sys.stdin.read(); time.sleep(0.5)"
    pool.procs = [
        subprocess.Popen(
            [sys.executable, "-c", slow_exit], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        for _ in range(3)
    ]
    pool.channels = [(p.stdin, p.stdout) for p in pool.procs]  # (jobs, replies) per worker
    procs = list(pool.procs)
    t0 = time.perf_counter()
    pool.close(wait=False)
    assert time.perf_counter() - t0 < 0.4 and pool.procs == []
    deadline = time.time() + 30
    while any(p.returncode is None for p in procs) and time.time() < deadline:
        time.sleep(0.05)
    assert [p.returncode for p in procs] == [0, 0, 0]
    while os.path.exists(pool._claims) and time.time() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(pool._claims)


def test_default_backend_runs_without_numpy(run_python):
    # NumPy is not a kiln dependency: the default backend once imported Triton's interpreter
    # support (which imports NumPy) while stopping compile workers no graph had started.
    code = (
        "import sys\n"
        "sys.modules['numpy'] = None  # unimportable, as on an install without NumPy\n"
        "import torch, kiln\n"
        "f = kiln.compile(lambda x: (x.sin() * 2).relu() + 1)\n"
        "for _ in range(2):\n"
        "    x = torch.randn(64)\n"
        "    torch.testing.assert_close(f(x), (x.sin() * 2).relu() + 1)\n"
        "assert sys.modules['numpy'] is None\n"
        "print('ok')\n"
    )
    assert run_python("-c", code).stdout.strip().endswith("ok")
