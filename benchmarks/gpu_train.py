"""kiln against torch.compile on the suite's nanoGPT training step (GPU, float32), one process.

A step: gradients set to None, forward, `out.float().sum().backward()`. Prints each compiler's
best time per step (best of 5 x 10 steps, synchronized), the GPU time per step and the kernels
it is spent in (torch.profiler), and the cold compile time (first step). Point the cache
variables (KILN_CACHE_DIR, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR) at empty folders for a
cold compile.

Usage: PYTHONPATH=src python3 benchmarks/gpu_train.py [--size large]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from gpu_compare import best_ms  # noqa: E402
from gpu_profile import _kernel_table  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="large")
    args = ap.parse_args()
    import kiln
    from kiln.bench.suite import load_models

    models = load_models(os.path.join(os.path.dirname(__file__), "models"))
    model, inputs = models["nanogpt"].factory("cuda", torch.float32, args.size, 0)
    model.train()

    def step_of(fn):
        def step(*xs):
            for p in model.parameters():
                p.grad = None
            fn(*xs).float().sum().backward()

        return step

    eager = best_ms(step_of(model), inputs, n=10)
    rows = []
    for name, compile_fn in (("kiln", kiln.compile), ("torch.compile", torch.compile)):
        compiled = compile_fn(model)
        t0 = time.perf_counter()
        step_of(compiled)(*inputs)
        torch.cuda.synchronize()
        cold = time.perf_counter() - t0
        ms = best_ms(step_of(compiled), inputs, n=10)
        gpu_us, table = _kernel_table(step_of(compiled), inputs, calls=3, rows_shown=120)
        rows.append(f"{name}: {ms:.2f} ms (GPU {gpu_us / 1e3:.2f} ms), first step {cold:.1f} s")
        rows.append(table)
    print(f"nanoGPT training step, float32, eager {eager:.2f} ms")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
