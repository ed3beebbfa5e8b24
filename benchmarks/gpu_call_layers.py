"""Where a compiled inference call's CPU time goes (GPU): the whole call, the wrapper program
alone, and the wrapper with its Triton launches, its convolutions, or both replaced by no-ops.

Builds `MODELS[name]` (benchmarks/models, size "large", bfloat16, CUDA), compiles it with kiln,
and prints median CPU microseconds per call, each call started on an idle device: the full call
(guards, runtime, wrapper), the wrapper's `call` on the same inputs, the wrapper with every
launch a no-op (each grid entry of each `FastKernel` swapped for one), with every convolution a
no-op (returning the real outputs recorded from one call, in order), and with both. The
differences are the share of launches, of convolutions, and of everything else the wrapper does
(allocations, views, checks). The no-op runs compute nothing right; they only time the host.

Usage: PYTHONPATH=src python3 benchmarks/gpu_call_layers.py [MODEL]   (default tv_resnet50)
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_compare import model  # noqa: E402


def cpu_us(fn, n: int = 300) -> float:
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def fast_kernels() -> list:
    from kiln.runtime.triton_launch import FastKernel

    return [o for o in gc.get_objects() if isinstance(o, FastKernel)]


def main() -> None:
    import kiln
    from kiln.codegen.compiled import CompiledGraph

    name = sys.argv[1] if len(sys.argv) > 1 else "tv_resnet50"
    m, inputs = model(name)
    seen = {}
    real_call = CompiledGraph.__call__

    def spy(self, *args):
        boxed = len(args) == 1 and type(args[0]) is list
        seen.setdefault("graph", (self, list(args[0]) if boxed else list(args)))
        return real_call(self, *args)

    with torch.no_grad():
        k = kiln.compile(m)
        for _ in range(5):
            k(*inputs)
        CompiledGraph.__call__ = spy
        k(*inputs)
        CompiledGraph.__call__ = real_call
        graph, args = seen["graph"]
        fn, ns = graph._fn, graph._fn.__globals__
        full = cpu_us(lambda: k(*inputs))
        wrapper = cpu_us(lambda: fn(list(args)))

        entries = {(id(fk), g): (fk, g, v) for fk in fast_kernels() for g, v in fk.items()}

        def launches(on: bool) -> None:
            for fk, g, v in entries.values():
                fk[g] = v if on else (lambda *a, **kw: None)

        launches(False)
        no_launch = cpu_us(lambda: fn(list(args)))
        launches(True)
        convs = {n: ns[n] for n in ns if "convolution" in n}
        outs: list = []

        def recording(f):
            return lambda *a, **kw: outs.append(f(*a, **kw)) or outs[-1]

        ns.update({n: recording(f) for n, f in convs.items()})
        fn(list(args))
        torch.cuda.synchronize()
        turn = [0]

        def replay(*a, **kw):
            turn[0] += 1
            return outs[(turn[0] - 1) % len(outs)]

        ns.update({n: replay for n in convs})
        no_conv = cpu_us(lambda: fn(list(args)))
        launches(False)
        neither = cpu_us(lambda: fn(list(args)))
        launches(True)
        ns.update(convs)
        eager = cpu_us(lambda: m(*inputs))
    print(
        f"{name}: CPU us per call: full {full:.0f}, wrapper {wrapper:.0f}, wrapper without "
        f"launches ({len(entries)} kernels) {no_launch:.0f}, without convolutions ({len(outs)}) "
        f"{no_conv:.0f}, without either {neither:.0f}; eager {eager:.0f}"
    )


if __name__ == "__main__":
    main()
