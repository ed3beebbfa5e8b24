"""Where a CPU row's time goes, kernel by kernel: kiln's kernels and ATen calls, torch.compile's.

Builds one benchmark model (benchmarks/models) in one process, compiles a copy with kiln and a
copy with torch.compile, and times eager, kiln and torch.compile interleaved (A, B, C, C, B, A
... medians), so all three see the same machine load. Then it gives, per compiler, the time of
each call the compiled code makes:

- kiln: every kernel and extern (ATen) call of each compiled graph's wrapper program, timed by
  wrapping the names of the wrapper's namespace (`kernel3`, `aten_addmm_out`), so the figure
  is the call as the wrapper makes it (ctypes/native launch included);
- torch.compile: `torch.profiler` self times, with inductor's `cpp.enable_kernel_profile` on so
  each generated C++ kernel is its own row (`graph_0_cpp_fused_gelu_view_2`).

"rest" is what a call spends outside those (guards, the wrapper's own Python, allocation).
On a shared 2-core machine run it with `OMP_NUM_THREADS=1` to compare kernels' code rather than
how OpenMP threads fare under other processes' load; results are per call, in microseconds.

Usage: PYTHONPATH=src python3 benchmarks/cpu_kernel_table.py hf_bert [--train] [--calls 100]
           [--compilers kiln,torch] [--rows 25]
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from models import MODELS  # noqa: E402

import kiln  # noqa: E402
from kiln.bench.measure import Step  # noqa: E402
from kiln.codegen import compiled as compiled_mod  # noqa: E402


def _record_graphs() -> list:
    """Every `CompiledGraph` made from now on (their wrappers' namespaces are what we time)."""
    graphs: list = []
    init = compiled_mod.CompiledGraph.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        graphs.append(self)

    compiled_mod.CompiledGraph.__init__ = recording
    return graphs


def _time_wrapper_calls(graphs: list) -> tuple[dict, collections.Counter]:
    """Wrap each kernel and extern name of every graph's wrapper; gives (seconds, calls) by
    `g<graph>.<name>`, accumulated from now on."""
    spent: dict = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    for k, graph in enumerate(graphs):
        graph.finish()
        namespace = graph._fn.__globals__
        for name, fn in list(namespace.items()):
            if callable(fn) and name.startswith(("kernel", "aten_")):
                namespace[name] = _timed(fn, f"g{k}.{name}", spent, calls)
    return spent, calls


def _timed(fn, key: str, spent: dict, calls: collections.Counter):
    def call(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - t0
            calls[key] += 1

    return call


def _medians(steps: dict, inputs: tuple, rounds: int) -> dict:
    times: dict = {name: [] for name in steps}
    names = list(steps)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            steps[name](inputs)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--train", action="store_true", help="time a training step")
    ap.add_argument("--calls", type=int, default=100, help="calls per timed phase")
    ap.add_argument("--compilers", default="kiln,torch")
    ap.add_argument("--rows", type=int, default=25, help="rows of each table")
    args = ap.parse_args()
    compilers = args.compilers.split(",")
    graphs = _record_graphs()
    bench = MODELS[args.model]
    model, example = bench.factory("cpu", torch.float32, "small", 0)
    fresh = bench.inputs("cpu", torch.float32, "small", 1)
    model.train(args.train)
    grads: dict = {}
    steps = {"eager": Step(model, model, args.train, grads)}
    for name in compilers:
        other = copy.deepcopy(model)
        if name == "torch":
            import torch._inductor.config as inductor_config

            inductor_config.cpp.enable_kernel_profile = True
            steps[name] = Step(torch.compile(other), other, args.train, grads)
        else:
            steps[name] = Step(kiln.compile(other), other, args.train, grads)
    for step in steps.values():
        step(example), step(fresh), step(fresh)
    medians = _medians(steps, fresh, args.calls)
    print(f"{args.model}{' training step' if args.train else ''}: median ms per call, interleaved")
    for name, ms in medians.items():
        print(f"  {name:6s} {ms:9.3f} ms   speedup over eager {medians['eager'] / ms:.3f}x")
    if "kiln" in steps:
        spent, calls = _time_wrapper_calls(graphs)
        t0 = time.perf_counter()
        for _ in range(args.calls):
            steps["kiln"](fresh)
        total = (time.perf_counter() - t0) / args.calls * 1e6
        print(f"\nkiln, per call ({len(graphs)} graphs; {total:.0f} us with the timers):")
        for key, s in sorted(spent.items(), key=lambda kv: -kv[1])[: args.rows]:
            print(f"  {key:64s} {s / args.calls * 1e6:10.1f} us  x{calls[key] // args.calls}")
        print(f"  {'rest':64s} {total - sum(spent.values()) / args.calls * 1e6:10.1f} us")
    if "torch" in steps:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.calls):
                steps["torch"](fresh)
        print("\ntorch.compile, per call (profiler self time):")
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        for e in rows[: args.rows]:
            count = e.count // args.calls
            print(f"  {e.key[:64]:64s} {e.self_cpu_time_total / args.calls:10.1f} us  x{count}")


if __name__ == "__main__":
    main()
