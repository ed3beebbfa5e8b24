"""Measuring one row: compile a model, check it against eager, time it, take its peak memory.

Takes a `Task` (suite.py), the model's `BenchModel` and a compiler from `COMPILERS`; gives one
result row (a dict with the JSON fields of `kiln bench`). worker.py calls `run_task` in a fresh
process with fresh cache folders, so `compile_s` is a cold compile; tests call it in-process with
tiny models and deliberately wrong compilers.

How each figure is taken:
- correct: the compiled model's outputs (training: outputs, parameter gradients and buffers after
  one forward + backward) equal eager's, on the example inputs it compiled for and on fresh
  random inputs from another seed. A tensor passes when max|a - b| <= tol * max|b| (plus a tiny
  floor), with tol 1e-3 in float32 and 5e-2 in bfloat16/float16; `max_err` records the worst
  ratio, so a reader sees the margin.
- fallbacks (kiln): how many graphs ran on eager ATen kernels because kiln's code generator or
  its AOT autograd gave up on them (`kiln.backends.builtin.fallbacks`), the first reasons in
  `fallback_reasons`. Such a row can be correct while kiln's code did not run; the report marks it.
- compile_s: wall time from the compile call to the end of the first call (training: the first
  forward + backward), device synchronised: what a user waits for on a cold start.
- median_ms: median of interleaved runs: eager and compiled alternate (order swapped every
  round) so that load from other processes falls on both alike; on CUDA each run is timed with
  CUDA events after a synchronize: a call started on an idle device, CPU launch cost included.
  speedup_vs_eager is eager's median over the compiled one's, both from the same process.
- steady_ms (CUDA only): back-to-back time, as a training or serving loop runs: blocks of
  `B2B_CALLS` calls after `B2B_WARMUP` untimed ones, no synchronize between calls, each call
  timed by CUDA events recorded around it on the stream (so a call's time is what the device
  spent from its first launch to its last, including gaps where the CPU could not keep up);
  the median over `B2B_BLOCKS` blocks per step, eager's and the compiled step's blocks
  alternating. steady_speedup_vs_eager is eager's over the compiled one's. On the CPU calls are
  synchronous and median_ms already is the back-to-back time.
- peak_mem_bytes: on CUDA, `torch.cuda.max_memory_allocated()` over one steady-state call
  (parameters, inputs and memory the compiled function holds included). On CPU, the bytes of the
  parameters, buffers and inputs, plus the arena blocks kiln's compiled graphs hold between
  calls (`kiln.runtime.arenas.held_bytes`: allocated by an earlier call, so the profiler does
  not see them), plus the peak of tensor memory allocated during one steady-state call, from the
  profiler's allocator events (`profile_memory=True`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import logging
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .suite import Task

TOLERANCES = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 5e-2}


@dataclass
class Compiled:
    """A compiled callable and a way to read, after it ran, how many graphs and breaks it has."""

    fn: Callable
    counts: Callable[[], tuple[int | None, int | None]] = lambda: (None, None)
    break_reasons: Callable[[], list[str]] = lambda: []
    # Graphs that ran on eager kernels instead of the compiler's code, each with why (None: the
    # compiler does not say; torch.compile's own fallbacks are not counted).
    fallbacks: Callable[[], list[str]] | None = lambda: []


def compile_eager(model: torch.nn.Module, mode: str) -> Compiled:
    return Compiled(model, lambda: (0, 0))


def compile_torch(model: torch.nn.Module, mode: str) -> Compiled:
    """torch.compile, the system kiln is compared with; counts come from TorchDynamo's counters."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(model, mode=None if mode == "default" else mode)

    def counts() -> tuple[int, int]:
        return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())

    return Compiled(
        fn, counts, lambda: [str(reason) for reason in counters["graph_break"]], fallbacks=None
    )


class _CountRecords(logging.Handler):
    """Keeps the messages logged to one artifact log."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.reasons.append(record.getMessage())


def compile_kiln(model: torch.nn.Module, mode: str) -> Compiled:
    """kiln.compile with a counting backend around kiln's own. Graph breaks are the records on
    the `kiln.graph_breaks` log; fallbacks (a graph left to eager kernels because the code
    generator or AOT autograd gave up) are the entries the backends add to their record
    (`kiln.backends.builtin.fallbacks`) from here on. Both logs, `graph_breaks` and
    `perf_hints` (where the code generator says why it declines a graph), are switched on, and
    their text also goes to the worker's stderr."""
    import kiln
    from kiln import logs
    from kiln.backends import builtin
    from kiln.backends.registry import lookup_backend
    from kiln.contracts import takes_capture_info

    real = lookup_backend("inductor")
    graphs = [0]

    @takes_capture_info  # kiln's backend must get capture's facts and the options (the mode)
    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list, info=None):
        graphs[0] += 1
        return real(gm, example_inputs, info=info)

    breaks = _CountRecords()
    logging.getLogger("kiln.graph_breaks").addHandler(breaks)
    kiln.set_logs(*(logs.enabled_artifacts() | {"graph_breaks", "perf_hints"}))
    kiln.reset()
    before = len(builtin.fallbacks())
    fn = kiln.compile(model, backend=counting_backend, mode=None if mode == "default" else mode)
    return Compiled(
        fn,
        lambda: (graphs[0], len(breaks.reasons)),
        lambda: breaks.reasons,
        lambda: [str(f) for f in builtin.fallbacks()[before:]],
    )


COMPILERS: dict[str, Callable[[torch.nn.Module, str], Compiled]] = {
    "eager": compile_eager,
    "torch": compile_torch,
    "kiln": compile_kiln,
}


def flatten(out) -> list:
    """The tensors (and other leaves) of a model output, in a fixed order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in flatten(out[k])]
    if isinstance(out, (list, tuple)):
        return [t for x in out for t in flatten(x)]
    if hasattr(out, "to_tuple"):  # transformers' ModelOutput
        return flatten(out.to_tuple())
    return [out]


class Step:
    """One benchmark call: inference under no_grad, or a training step (gradients set to None,
    forward, backward with fixed random output gradients shared by eager and compiled)."""

    def __init__(self, fn: Callable, module: torch.nn.Module, train: bool, grads: dict):
        self.fn, self.module, self.train, self._grads = fn, module, train, grads

    def __call__(self, inputs: tuple):
        if not self.train:
            with torch.no_grad():
                return self.fn(*inputs)
        for p in self.module.parameters():
            p.grad = None
        out = self.fn(*inputs)
        outs = [t for t in flatten(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        torch.autograd.backward(outs, [self._grad_like(t) for t in outs])
        return out

    def _grad_like(self, t: torch.Tensor) -> torch.Tensor:
        key = (tuple(t.shape), t.dtype, str(t.device))
        if key not in self._grads:  # drawn once, so eager and compiled get identical gradients
            gen = torch.Generator().manual_seed(len(self._grads) + 12345)
            g = torch.randn(t.shape, generator=gen, dtype=torch.float32)
            self._grads[key] = g.to(device=t.device, dtype=t.dtype)
        return self._grads[key]

    def snapshot(self, out) -> dict[str, object]:
        """Outputs (and, training, gradients and buffers) detached and cloned, by name."""
        snap = {f"output[{i}]": _clone(t) for i, t in enumerate(flatten(out))}
        if self.train:
            for name, p in self.module.named_parameters():
                snap[f"grad {name}"] = _clone(p.grad)
            for name, b in self.module.named_buffers():
                snap[f"buffer {name}"] = _clone(b)
        return snap


def _clone(t):
    return t.detach().clone() if isinstance(t, torch.Tensor) else t


def compare(actual: dict, expected: dict, tol: float) -> tuple[bool, float, str]:
    """(all match, worst error ratio, what failed first) between two snapshots."""
    worst, first_bad = 0.0, ""
    if list(actual) != list(expected):
        return False, math.inf, f"different outputs: {list(actual)[:4]} vs {list(expected)[:4]}"
    for name, b in expected.items():
        a = actual[name]
        ok, err, why = _compare_one(a, b, tol)
        worst = max(worst, err)
        if not ok and not first_bad:
            first_bad = f"{name}: {why}"
    return not first_bad, worst, first_bad


def _compare_one(a, b, tol: float) -> tuple[bool, float, str]:
    if not isinstance(b, torch.Tensor) or not isinstance(a, torch.Tensor):
        same = (a is None and b is None) or (
            not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) and a == b
        )
        return same, 0.0 if same else math.inf, "" if same else f"{_kind(a)} vs {_kind(b)}"
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, math.inf, f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if not b.is_floating_point():
        same = bool(torch.equal(a, b))
        return same, 0.0 if same else math.inf, "" if same else "integer values differ"
    a64, b64 = a.double(), b.double()
    if not torch.equal(a64.isnan(), b64.isnan()):
        return False, math.inf, "NaNs in different places"
    a64, b64 = a64.nan_to_num(0.0), b64.nan_to_num(0.0)
    scale = max(float(b64.abs().max()) if b64.numel() else 0.0, 1e-6)
    err = float((a64 - b64).abs().max()) / scale if b64.numel() else 0.0
    return err <= tol, err, f"max |a-b| is {err:.2e} of max |b| (tolerance {tol:.0e})"


def _kind(x) -> str:
    return "None" if x is None else type(x).__name__


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def interleaved_medians(
    steps: list[Callable], inputs: tuple, device: str, budget_s: float, min_reps: int = 5
) -> list[float]:
    """Median milliseconds of each step, the steps run in alternating order round after round
    until about `budget_s` seconds have gone (at least `min_reps` rounds)."""
    for step in steps:  # warm-up: caches, allocator, lazy initialisation
        step(inputs)
    _sync(device)
    t0 = time.perf_counter()
    for step in steps:
        step(inputs)
    _sync(device)
    per_round = max(time.perf_counter() - t0, 1e-6)
    reps = max(min_reps, min(1000, int(budget_s / per_round)))
    times: list[list[float]] = [[] for _ in steps]
    for r in range(reps):
        order = range(len(steps)) if r % 2 == 0 else reversed(range(len(steps)))
        for i in order:
            times[i].append(_time_one(steps[i], inputs, device))
    return [statistics.median(t) for t in times]


B2B_WARMUP, B2B_CALLS, B2B_BLOCKS = 5, 30, 3


def back_to_back_medians(steps: list[Callable], inputs: tuple) -> list[float]:
    """Median milliseconds per call of each step called back to back on a CUDA device (see
    the module docstring); the steps' blocks alternate, order swapped every block."""
    times: list[list[float]] = [[] for _ in steps]
    for b in range(B2B_BLOCKS):
        order = range(len(steps)) if b % 2 == 0 else reversed(range(len(steps)))
        for i in order:
            times[i] += _back_to_back_block(steps[i], inputs)
    return [statistics.median(t) for t in times]


def _back_to_back_block(step: Callable, inputs: tuple) -> list[float]:
    torch.cuda.synchronize()
    for _ in range(B2B_WARMUP):
        step(inputs)
    events = []
    for _ in range(B2B_CALLS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(inputs)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def _time_one(step: Callable, inputs: tuple, device: str) -> float:
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        step(inputs)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    step(inputs)
    return (time.perf_counter() - t0) * 1e3


def peak_memory(step: Step, inputs: tuple, device: str, other=None) -> int:
    """Peak bytes over one steady-state call (see the module docstring for what is counted).
    `other`: a module alive beside this one whose bytes CUDA's counter would include."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step(inputs)
        torch.cuda.synchronize()
        extra = _resident_bytes(other, ()) if other is not None else 0
        return int(torch.cuda.max_memory_allocated()) - extra
    from torch.profiler import ProfilerActivity, profile

    from kiln.runtime.arenas import held_bytes

    held = held_bytes()  # kept from earlier calls: the profiler sees only what a call allocates
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(inputs)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return _resident_bytes(step.module, inputs) + held + peak


def _resident_bytes(module: torch.nn.Module, inputs: tuple) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    tensors += [x for x in inputs if isinstance(x, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def run_task(
    task: Task, bench_model, compile_fn: Callable[[torch.nn.Module, str], Compiled]
) -> list[dict]:
    """Measure one row (and, with `task.with_eager`, eager's row first, from the same process);
    failures become a row with `correct: False` and the error's text."""
    lock = PhaseLock(task.timing_lock)
    lock.shared()
    try:
        return _run_task(task, bench_model, compile_fn, lock)
    finally:
        lock.release()


def _run_task(task: Task, bench_model, compile_fn, lock: PhaseLock) -> list[dict]:
    dtype = getattr(torch, task.dtype)
    model_e, example = bench_model.factory(task.device, dtype, task.size, task.seed)
    fresh = bench_model.inputs(task.device, dtype, task.size, task.seed + 1)
    model_c = copy.deepcopy(model_e)
    model_e.train(task.train)
    model_c.train(task.train)
    grads: dict = {}
    step_e = Step(model_e, model_e, task.train, grads)
    ref = [step_e.snapshot(step_e(example)), step_e.snapshot(step_e(fresh))]
    eager = _eager_row(task, step_e, fresh, model_c) if task.with_eager else None
    row = base_row(task)
    phase = "compile"
    try:
        _sync(task.device)
        t0 = time.perf_counter()
        compiled = compile_fn(model_c, task.mode)
        step_c = Step(compiled.fn, model_c, task.train, grads)
        first = step_c.snapshot(step_c(example))
        _sync(task.device)
        row["compile_s"] = None if task.compiler == "eager" else time.perf_counter() - t0
        phase = "check"
        _check(row, [first, step_c.snapshot(step_c(fresh))], ref, TOLERANCES.get(dtype, 1e-3))
        row["graphs"], row["graph_breaks"] = compiled.counts()
        row["break_reasons"] = [" ".join(r.split())[:300] for r in compiled.break_reasons()[:3]]
        if compiled.fallbacks is not None:
            fell_back = compiled.fallbacks()
            row["fallbacks"] = len(fell_back)
            row["fallback_reasons"] = [" ".join(r.split())[:300] for r in fell_back[:3]]
        phase = "timing"
        with lock.exclusive():
            eager_ms, compiled_ms = _time_rows(task, step_e, step_c, fresh)
            steady = _steady_rows(task, step_e, step_c, fresh)
        row.update(
            median_ms=compiled_ms, eager_ms=eager_ms, speedup_vs_eager=eager_ms / compiled_ms
        )
        if eager is not None:
            eager.update(median_ms=eager_ms, eager_ms=eager_ms, speedup_vs_eager=1.0)
        if steady is not None:
            eager_steady, compiled_steady = steady
            row.update(
                steady_ms=compiled_steady,
                eager_steady_ms=eager_steady,
                steady_speedup_vs_eager=eager_steady / compiled_steady,
            )
            if eager is not None:
                eager.update(steady_ms=eager_steady, eager_steady_ms=eager_steady)
                eager["steady_speedup_vs_eager"] = 1.0
        phase = "memory"
        step_e = model_e = ref = first = None  # free eager's copy: only the compiled one is live
        row["peak_mem_bytes"] = peak_memory(step_c, fresh, task.device)
    except Exception as exc:  # a compiler failing is a result to report, not a crash
        row["correct"] = row["correct"] if phase in ("timing", "memory") else False
        row["error"] = f"{phase}: {type(exc).__name__}: {exc}"[:2000]
        if eager is not None and eager["median_ms"] is None and step_e is not None:
            # the compiled model failed before the interleaved timing: time eager on its own
            with lock.exclusive():
                (eager_ms,) = interleaved_medians([step_e], fresh, task.device, task.timing_s)
            eager.update(median_ms=eager_ms, eager_ms=eager_ms, speedup_vs_eager=1.0)
    return [row] if eager is None else [eager, row]


def _time_rows(task: Task, step_e, step_c, fresh) -> tuple[float, float]:
    """(eager's median ms, the compiled one's), timed interleaved."""
    if task.compiler == "eager":
        (eager_ms,) = interleaved_medians([step_e], fresh, task.device, task.timing_s)
        return eager_ms, eager_ms
    eager_ms, compiled_ms = interleaved_medians([step_e, step_c], fresh, task.device, task.timing_s)
    return eager_ms, compiled_ms


def _steady_rows(task: Task, step_e, step_c, fresh) -> tuple[float, float] | None:
    """(eager's back-to-back median ms, the compiled one's) on CUDA; None on the CPU."""
    if not task.device.startswith("cuda"):
        return None
    if task.compiler == "eager":
        (eager_ms,) = back_to_back_medians([step_e], fresh)
        return eager_ms, eager_ms
    eager_ms, compiled_ms = back_to_back_medians([step_e, step_c], fresh)
    return eager_ms, compiled_ms


class PhaseLock:
    """The run's lock between concurrent workers (`kiln bench --jobs N`): a worker holds it
    shared while it builds, compiles, checks and measures memory (work other workers may
    overlap), and exclusive while it times, so that no other worker touches the device — or
    compiles on its cores — while one is being timed. `flock` on a file of the runner's; no lock
    at all when workers run one by one (`path` None)."""

    def __init__(self, path: str | None) -> None:
        self.file = open(path, "a") if path else None  # noqa: SIM115 - held for the run

    def _set(self, how: int) -> None:
        if self.file is not None:
            import fcntl

            fcntl.flock(self.file, how)

    def shared(self) -> None:
        import fcntl

        self._set(fcntl.LOCK_SH)

    @contextlib.contextmanager
    def exclusive(self):
        import fcntl

        self._set(fcntl.LOCK_EX)  # converting a shared lock: released first, never deadlocks
        try:
            yield
        finally:
            self._set(fcntl.LOCK_SH)

    def release(self) -> None:
        if self.file is not None:
            import fcntl

            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None


def _check(row: dict, got: list[dict], ref: list[dict], tol: float) -> None:
    """Fill `correct`, `max_err` and (when wrong) `error` from snapshots against eager's."""
    results = [compare(g, r, tol) for g, r in zip(got, ref)]
    row["correct"] = all(ok for ok, _, _ in results)
    row["max_err"] = max(err for _, err, _ in results)
    bad = [
        f"{which}: {why}" for (ok, _, why), which in zip(results, ("example", "fresh")) if not ok
    ]
    if bad:
        row["error"] = "wrong result on " + "; ".join(bad)


def _eager_row(task: Task, step_e: Step, inputs: tuple, other: torch.nn.Module) -> dict:
    """Eager's own row, measured in a compiled row's process: eager is the reference (so it is
    correct by definition), its time is the eager half of the interleaved timing."""
    row = base_row(dataclasses.replace(task, compiler="eager", mode="default"))
    row.update(correct=True, max_err=0.0, graphs=0, graph_breaks=0, fallbacks=0)
    row["peak_mem_bytes"] = peak_memory(step_e, inputs, task.device, other)
    return row


def base_row(task: Task) -> dict:
    """A row with every JSON field present, unmeasured ones None."""
    return {
        "model": task.model,
        "compiler": task.compiler,
        "mode": task.mode,
        "device": task.device,
        "dtype": task.dtype,
        "train": task.train,
        "size": task.size,
        "correct": None,
        "compile_s": None,
        "median_ms": None,
        "speedup_vs_eager": None,
        "peak_mem_bytes": None,
        "graphs": None,
        "graph_breaks": None,
        "eager_ms": None,
        "steady_ms": None,  # back-to-back (CUDA only)
        "eager_steady_ms": None,
        "steady_speedup_vs_eager": None,
        "max_err": None,
        "error": None,
        "break_reasons": [],
        "fallbacks": None,  # how many graphs ran on eager kernels (None: not known)
        "fallback_reasons": [],
    }
