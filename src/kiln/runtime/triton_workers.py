"""The Triton compile workers: a pool of long-lived processes that compile kernels in parallel.

Takes jobs (one kernel of a kernel-module file each, with Triton's specialization of its launch,
or its argument dtypes, grid, constexprs and warps); gives, per job, whether the worker compiled
it into Triton's on-disk cache. The parent's first launch of a compiled kernel then only loads
the binary (and its C launcher, which the worker built too).

Each worker is `python triton_worker_main.py` (a standalone script: never the user's `__main__`,
never kiln), speaking one JSON line per job each way over pipes. Jobs go to whichever worker is
free, so one slow kernel does not hold up the rest. `start()` launches the processes without
waiting for them, so that their start-up (importing Triton and paying its once-a-process costs,
about half a second) overlaps lowering and scheduling; `run()` waits. A worker that dies fails
its job, which the caller then compiles itself: a worker problem costs time, never correctness.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
import threading
import time

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_worker_main.py")


class WorkerPool:
    def __init__(self, workers: int, target: list | None = None) -> None:
        argv = [sys.executable, _SCRIPT] + ([json.dumps(target)] if target else [])
        self.procs: list[subprocess.Popen] = []
        for i in range(workers):
            self.procs.append(
                subprocess.Popen(
                    argv + (["driver"] if target and i == 0 else []),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    bufsize=1,
                )
            )
        self._ready: set[int] = set()
        self.started = time.time()
        # seconds from the pool's start until each worker was ready, and each kernel's compile
        # seconds in its worker in the last `run` (the builder logs them)
        self.ready_after: dict[int, float] = {}
        self.kernel_seconds: dict[str, float] = {}

    def run(self, jobs: list[dict], meanwhile=None) -> dict[str, str | None]:
        """Run every job; {kernel: None if compiled, else the reason it was not}. `meanwhile`:
        a function to call once every job has been handed out, while the workers compile."""
        results: dict[str, str | None] = {}
        self.kernel_seconds = {}
        pending = list(reversed(jobs))
        sel = selectors.DefaultSelector()
        busy: dict[int, dict | None] = {}
        for i, p in enumerate(self.procs):
            if p.poll() is None:
                sel.register(p.stdout, selectors.EVENT_READ, i)
                busy[i] = None
                if i in self._ready:
                    self._send(i, pending, busy)
        while sel.get_map() and (pending or any(j is not None for j in busy.values())):
            for key, _ in sel.select():
                i = key.data
                line = self.procs[i].stdout.readline()
                if not line:  # the worker died: its job failed, it takes no more
                    sel.unregister(key.fileobj)
                    job = busy.pop(i)
                    if job is not None:
                        results[job["kernel"]] = "the compile worker exited"
                    continue
                reply = json.loads(line)
                if reply.get("ready"):
                    self._ready.add(i)
                    self.ready_after[i] = reply.get("at", time.time()) - self.started
                else:
                    job = busy[i]
                    results[job["kernel"]] = None if reply["ok"] else reply.get("error", "?")
                    self.kernel_seconds[job["kernel"]] = reply.get("seconds", 0.0)
                    busy[i] = None
                self._send(i, pending, busy)
            if meanwhile is not None and not pending:
                meanwhile, later = None, meanwhile
                later()
        sel.close()
        if meanwhile is not None:
            meanwhile()
        for job in pending:
            results[job["kernel"]] = "no compile worker was left"
        return results

    def _send(self, i: int, pending: list, busy: dict) -> None:
        if not pending or busy.get(i) is not None:
            return
        job = pending.pop()
        busy[i] = job
        try:
            self.procs[i].stdin.write(json.dumps(job) + "\n")
            self.procs[i].stdin.flush()
        except OSError:  # died between jobs: the read side reports it
            pass

    def close(self, wait: bool = True) -> None:
        """Tell every worker to exit (end of input); `wait`: until they have, else reap them
        in a background thread. A worker takes ~1 s to exit (it releases a CUDA context), and
        the first call after a compile need not wait for that (BERT's cold first call spent
        0.97 s of its 9.5 s here)."""
        procs, self.procs = self.procs, []
        for p in procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        if wait:
            _reap(procs)
        else:
            threading.Thread(target=_reap, args=(procs,), daemon=True).start()


def _reap(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


_pool: WorkerPool | None = None


def start(workers: int, target: list | None = None) -> WorkerPool:
    """The process-wide pool, launched on first use (the processes start in the background).
    `target`: the GPU the kernels are for (`[backend, arch, warp_size]`), which lets workers
    compile without importing torch (triton_worker_main.py)."""
    global _pool
    if _pool is None:
        _pool = WorkerPool(workers, target)
        atexit.register(shutdown)
    return _pool


def shutdown(wait: bool = True) -> None:
    global _pool
    if _pool is not None:
        _pool.close(wait)
        _pool = None
