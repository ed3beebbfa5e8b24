"""A cold compile split by phase: the imports kiln's first call makes, then each pass (GPU).

Builds `MODELS[name]` (benchmarks/models, size "large"; bfloat16, or float32 with --train),
runs it eagerly once (`compile_profile.cold_model`), then, with fresh cache folders, times the
first compiled call. For kiln, the imports its first call makes are timed first, one by one
(`kiln.codegen`, which brings sympy; the first `FakeTensorMode()`, which imports
`torch._dynamo`), and capture's trace, the autograd and Triton passes and the first run's wait
for kernels still compiling are wrapped in timers. For torch.compile,
`import torch._dynamo` is timed, then the first call.
Unlike `compile_profile.py` there is no profiler, so the figures are wall times a user sees.
The garbage collector's work from the start of the timed imports to the end of the first call
is timed too (`gc.callbacks`): full collections (generation 2) and young ones.

Usage: PYTHONPATH=src python3 benchmarks/compile_phases.py MODEL [--train] [--compiler torch]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_profile import cold_model  # noqa: E402

_AUTOGRAD = ("analyze", "trace_inference", "trace_training", "partition_joint")
_PIPELINE = ("run_rewrites", "lower_graph", "schedule")  # codegen/pipeline.py
_TRITON = ("render_module", "render_wrapper", "load")  # codegen/triton/device.py
_TRITON += ("finish_compiles",)  # the first run's wait for kernels the workers still compile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--compiler", choices=("kiln", "torch"), default="kiln")
    args = ap.parse_args()
    dtype = "float32" if args.train else "bfloat16"
    model, step = cold_model(args.model, "cuda", dtype, args.train, "kiln-compile-phases-")
    import torch

    times: dict[str, float] = {}

    def timed(label, fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                times[label] = times.get(label, 0.0) + time.perf_counter() - start

        return wrapper

    def imported(label, thunk, context=contextlib.nullcontext):
        start = time.perf_counter()
        with context():
            thunk()
        times[label] = time.perf_counter() - start

    collections = time_collections()
    total = time.perf_counter()
    if args.compiler == "kiln":
        import kiln
        from kiln.gc_pause import paused_gc  # kiln's first call makes both imports in its pause

        imported("import kiln.codegen (sympy)", lambda: __import__("kiln.codegen"), paused_gc)
        from torch._subclasses.fake_tensor import FakeTensorMode

        label = "first FakeTensorMode() (imports torch._dynamo)"
        imported(label, FakeTensorMode, paused_gc)
        import kiln.autograd.compile as aot
        import kiln.codegen.pipeline as pipeline
        import kiln.codegen.triton.device as triton_device
        from kiln.capture.frontend import CompiledFunction

        capture = (CompiledFunction, ("_run_root",))  # capture's trace, which runs each op
        timed_parts = ((aot, _AUTOGRAD), (pipeline, _PIPELINE), (triton_device, _TRITON), capture)
        for module, names in timed_parts:
            for name in names:
                setattr(module, name, timed(name, getattr(module, name)))
        compiled = kiln.compile(model)
    else:
        imported("import torch._dynamo", lambda: __import__("torch._dynamo"))
        compiled = torch.compile(model)
    start = time.perf_counter()
    step(compiled)
    times["first call (capture, compile, run)"] = time.perf_counter() - start
    mode = "train" if args.train else "inference"
    print(f"{args.model} {mode} {args.compiler}: {time.perf_counter() - total:.2f} s in all")
    for label, seconds in times.items():
        print(f"  {label:50s} {seconds:6.2f}")
    full, young = full_and_young(collections)
    print(
        f"  garbage collection: {len(full)} full collections {sum(full):.2f} s, "
        f"{len(young)} young ones {sum(young):.2f} s"
    )
    if args.compiler == "kiln":
        from triton.runtime.cache import triton_key

        from kiln.runtime.triton_builder import STATS

        print(
            f"  kernels loaded by hash: {STATS['preloaded']} of {STATS['warmed']} compiled in "
            f"workers; Triton's own hash computed here: {triton_key.cache_info().misses > 0}"
        )
        print(
            f"  last parallel compile: workers ready {STATS['workers_ready_s']:.2f} s after "
            f"their start, slowest kernel {STATS['slowest_kernel_s']:.2f} s, "
            f"{STATS['kernel_seconds']:.2f} kernel-seconds in all"
        )


def time_collections() -> list[tuple[int, float]]:
    """(generation, seconds) of each garbage collection from now on, appended to the list this
    gives (benchmarks/gc_pause.py reads it too)."""
    out: list[tuple[int, float]] = []
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            out.append((info["generation"], time.perf_counter() - started[0]))

    gc.callbacks.append(callback)
    return out


def full_and_young(collections: list[tuple[int, float]]) -> tuple[list[float], list[float]]:
    """The seconds of the full collections (generation 2) and of the young ones."""
    return [s for g, s in collections if g == 2], [s for g, s in collections if g < 2]


if __name__ == "__main__":
    main()
