"""The Triton compile workers: a pool of long-lived processes that compile kernels in parallel.

Takes jobs (one kernel of a kernel-module file each, with Triton's specialization of its launch,
or its argument dtypes, grid, constexprs and warps); gives, per job, whether the worker compiled
it into Triton's on-disk cache. The parent's first launch of a compiled kernel then only loads
the binary (and its C launcher, which the worker built too).

The workers run `triton_worker_main.py` (a standalone script: never the user's `__main__`, never
kiln), speaking one JSON line per job each way over pipes. Where the system can fork, the pool
starts one process, which forks the other workers once it has imported Triton, so that the
import is paid once and not by every worker at the same time. Jobs go to whichever worker is
free, so one slow kernel does not hold up the rest. `start()` launches the workers without
waiting for them, so that their start-up (importing Triton and paying its once-a-process costs,
about half a second) overlaps lowering and scheduling. `submit()` hands jobs out and returns;
`wait()` serves the workers until given jobs are done (so a training step's backward kernels
compile while its forward is lowered), and `as_completed()` gives each job as it finishes;
`run()` is `submit()` then `wait()`. A worker that dies fails its job, which the
caller then compiles itself: a worker problem costs time, never correctness.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_worker_main.py")


class WorkerPool:
    def __init__(self, workers: int, target: list | None = None) -> None:
        argv = [sys.executable, _SCRIPT] + ([json.dumps(target)] if target else [])
        # where the workers claim the C launchers they build, so that kernels with the same
        # signature (which share a launcher) do not each run gcc for it (triton_worker_main.py)
        self._claims = tempfile.mkdtemp(prefix="kiln-launchers-")
        env = dict(os.environ, KILN_LAUNCHER_CLAIMS=self._claims)
        # one process that forks the others once it has imported Triton; where there is no
        # fork, one process a worker
        forked = workers - 1 if hasattr(os, "fork") else 0
        self.procs: list[subprocess.Popen] = []
        self.channels: list[tuple] = []  # (jobs, replies) of each worker
        for i in range(workers - forked):
            driver = ["driver"] if target and i == 0 else []
            self._launch(argv + driver, env, forked if i == 0 else 0)
        self._sel = selectors.DefaultSelector()
        for i, (_, replies) in enumerate(self.channels):
            self._sel.register(replies, selectors.EVENT_READ, i)
        self._ready: set[int] = set()
        self._busy: dict[int, dict] = {}  # worker -> the job it is compiling
        self._queue: list[dict] = []  # jobs not handed out yet, the next one last
        self._results: dict[str, str | None] = {}  # job id -> None if compiled, else why not
        self.started = time.time()
        # seconds from the pool's start until each worker was ready, and each job's compile
        # seconds in its worker (the builder logs them)
        self.ready_after: dict[int, float] = {}
        self.pids: dict[int, int] = {}  # worker -> its process id, from its ready line
        self.seconds: dict[str, float] = {}
        self.hashes: dict[str, str] = {}  # job id -> its kernel's Triton cache hash, if known

    def _launch(self, argv: list[str], env: dict, forked: int) -> None:
        """Start one worker process, with pipes for `forked` more that it forks."""
        passed, pipes = [], []
        for _ in range(forked):
            jobs_r, jobs_w = os.pipe()
            replies_r, replies_w = os.pipe()
            passed += [jobs_r, replies_w]
            pipes.append((os.fdopen(jobs_w, "w"), os.fdopen(replies_r)))
        pairs = ",".join(f"{passed[k]}:{passed[k + 1]}" for k in range(0, len(passed), 2))
        proc = subprocess.Popen(
            argv + (["--channels", pairs] if pairs else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
            pass_fds=passed,
        )
        for fd in passed:  # the worker's ends
            os.close(fd)
        self.procs.append(proc)
        self.channels += [(proc.stdin, proc.stdout), *pipes]

    def submit(self, jobs: list[dict]) -> list[str]:
        """Queue `jobs` and hand out what ready workers can take now, without waiting; gives the
        jobs' ids (`path:kernel`) for `wait`. A job already done or queued is not run again."""
        ids = []
        for job in jobs:
            job_id = f"{job['path']}:{job['kernel']}"
            ids.append(job_id)
            queued = any(j["id"] == job_id for j in self._queue + list(self._busy.values()))
            if job_id not in self._results and not queued:
                self._queue.insert(0, dict(job, id=job_id))
        self._pump(timeout=0)
        return ids

    def wait(self, ids: list[str], meanwhile=None) -> dict[str, str | None]:
        """Serve the workers until every job of `ids` is done; {id: None if compiled, else the
        reason it was not}. `meanwhile`: a function to call once every queued job has been
        handed out, while the workers compile."""
        return dict(self.as_completed(ids, meanwhile))

    def as_completed(self, ids: list[str], meanwhile=None):
        """`wait`, giving each job's (id, None if compiled else why not) as soon as it is done,
        so that the caller can load a kernel while the workers compile the rest."""
        pending = list(dict.fromkeys(ids))
        while pending:
            for i in [i for i in pending if i in self._results]:
                pending.remove(i)
                yield i, self._results[i]
            if not pending or not self._sel.get_map():
                break
            if meanwhile is not None and not self._queue:
                meanwhile, later = None, meanwhile
                later()
                continue
            self._pump(timeout=None)
        if meanwhile is not None:
            meanwhile()
        for i in pending:
            yield i, "no compile worker was left"

    def run(self, jobs: list[dict], meanwhile=None) -> dict[str, str | None]:
        """`submit` then `wait`: {kernel: None if compiled, else the reason it was not}."""
        done = self.wait(self.submit(jobs), meanwhile)
        return {job["kernel"]: done[f"{job['path']}:{job['kernel']}"] for job in jobs}

    def _pump(self, timeout: float | None) -> None:
        """Read what the workers have said (within `timeout`), then hand out queued jobs."""
        for key, _ in self._sel.select(timeout) if self._sel.get_map() else ():
            i = key.data
            line = self.channels[i][1].readline()
            if not line:  # the worker died: its job failed, it takes no more
                self._sel.unregister(key.fileobj)
                self._ready.discard(i)
                job = self._busy.pop(i, None)
                if job is not None:
                    self._results[job["id"]] = "the compile worker exited"
                continue
            reply = json.loads(line)
            if reply.get("ready"):
                self._ready.add(i)
                self.ready_after[i] = reply.get("at", time.time()) - self.started
                self.pids[i] = reply.get("pid", 0)
            else:
                job = self._busy.pop(i)
                self._results[job["id"]] = None if reply["ok"] else reply.get("error", "?")
                self.seconds[job["id"]] = reply.get("seconds", 0.0)
                if reply.get("hash"):
                    self.hashes[job["id"]] = reply["hash"]
        for i in sorted(self._ready):
            if self._queue and i not in self._busy:
                self._send(i, self._queue.pop())

    def _send(self, i: int, job: dict) -> None:
        self._busy[i] = job
        try:
            jobs = self.channels[i][0]
            jobs.write(json.dumps(job) + "\n")
            jobs.flush()
        except OSError:  # died between jobs: the read side reports it
            pass

    def close(self, wait: bool = True) -> None:
        """Tell every worker to exit (end of input); `wait`: until they have, else reap them
        in a background thread. A worker takes ~1 s to exit (it releases a CUDA context), and
        the first call after a compile need not wait for that (BERT's cold first call spent
        0.97 s of its 9.5 s here)."""
        procs, self.procs = self.procs, []
        channels, self.channels = self.channels, []
        self._sel.close()
        for jobs, _ in channels:
            try:
                jobs.close()
            except OSError:
                pass
        replies = [r for _, r in channels]
        if wait:
            _reap(procs, replies, self._claims)
        else:
            reaping = (procs, replies, self._claims)
            threading.Thread(target=_reap, args=reaping, daemon=True).start()


def _reap(procs: list[subprocess.Popen], replies: list, claims: str) -> None:
    for p in procs:  # the first process waits for the workers it forked before it exits
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for r in replies:
        r.close()
    shutil.rmtree(claims, ignore_errors=True)


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
