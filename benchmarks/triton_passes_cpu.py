"""The Triton code generator's passes on nanoGPT's training graphs, timed on a machine without a
GPU (Triton's interpreter setting, so nothing is compiled or launched).

Traces the suite's nanoGPT (float32, training) with kiln's `aot_eager` backend on CPU tensors,
takes the forward and backward graphs the partition made, and times `kiln.codegen.triton`'s
passes on copies of each: the graph rewrites before lowering, `lower`, `schedule`,
`render_module` and `render_wrapper`. The first round of each graph carries the process's
first-use costs, as a cold compile does; later rounds are the passes alone. CPU-device graphs
differ a little from the GPU's (CPU attention kernels), but the passes are the same code, so
this measures kiln's compile-time work for the GPU path on the 2-core machine.

Usage: PYTHONPATH=src python benchmarks/triton_passes_cpu.py [--size small|large] [--rounds 3]
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when Triton is first imported
os.environ.setdefault("KILN_ARTIFACT_CACHE", "0")  # it reads AOT partitions: compile, never load
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


def passes(gm) -> dict[str, float]:
    """Seconds of each pass of the pipeline, as the cuda device runs them, on a copy of `gm`."""
    from kiln.codegen.triton import render_module, render_wrapper
    from kiln.devices.builtin import CUDA
    from kiln.lower import lower_graph
    from kiln.rewrites import run_rewrites
    from kiln.schedule import schedule

    gm = copy.deepcopy(gm)
    example = [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]
    times, start = {}, time.perf_counter()

    def lap(name: str) -> None:
        nonlocal start
        times[name] = time.perf_counter() - start
        start = time.perf_counter()

    run_rewrites(gm, example, CUDA.rewrites)
    lap("rewrites")
    graph = lower_graph(gm, list(example), CUDA.capabilities)
    lap("lower")
    sched = schedule(graph)
    lap("schedule")
    module = render_module(sched, interpret=False)
    lap("render_module")
    render_wrapper(sched, {k.name: k for k in module.kernels})
    lap("render_wrapper")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="large")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import torch

    import kiln
    from kiln.autograd.compile import AotCompiled
    from kiln.bench.suite import load_models

    models = load_models(os.path.join(os.path.dirname(os.path.abspath(__file__)), "models"))
    model, inputs = models["nanogpt"].factory("cpu", torch.float32, args.size, 0)
    model.train(True)
    compiled = kiln.compile(model, backend="aot_eager")
    compiled(*inputs)
    # the partition of the one compiled entry, found among the live objects
    live = [o for o in gc.get_objects() if isinstance(o, AotCompiled)]
    part = next(p for o in live for p in o.partitions.values())
    for name in ("bw", "fw"):
        for r in range(args.rounds):
            t = passes(getattr(part, name))
            cells = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in t.items())
            print(f"{name} round {r + 1}: {sum(t.values()) * 1e3:.1f} ms ({cells})")


if __name__ == "__main__":
    main()
