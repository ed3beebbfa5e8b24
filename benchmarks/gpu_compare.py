"""kiln against torch.compile on one suite model, in one process (GPU).

Builds `MODELS[name]` (benchmarks/models, size "large", bfloat16, CUDA), compiles it with kiln
and with torch.compile in the given mode, checks kiln against eager, and prints each one's best
time per call (best of 5 x 50 calls, synchronized) and cold compile time; `--profile` adds the
CUDA kernels kiln's call spends its time in. Unlike `kiln bench` (one fresh process per row,
three workers at once), both compilers are timed here back to back in one quiet process, which
is what a kernel-level comparison needs.

Usage: PYTHONPATH=src python3 benchmarks/gpu_compare.py MODEL [--mode reduce-overhead] [--profile]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


def model(name: str, dtype=torch.bfloat16):
    from kiln.bench.suite import load_models

    models = load_models(os.path.join(os.path.dirname(__file__), "models"))
    return models[name].factory("cuda", dtype, "large", 0)


def best_ms(fn, inputs, n: int = 50) -> float:
    for _ in range(3):
        fn(*inputs)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*inputs)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e3)
    return best


def compare(name: str, mode: str | None, profile: bool) -> None:
    import kiln

    m, inputs = model(name)
    with torch.no_grad():
        ref = m(*inputs).float()
        eager = best_ms(m, inputs)
        t0 = time.perf_counter()
        k = kiln.compile(m, mode=mode)
        err = (k(*inputs).float() - ref).abs().max().item()
        kiln_compile = time.perf_counter() - t0
        kiln_ms = best_ms(k, inputs)
        t0 = time.perf_counter()
        t = torch.compile(m, mode=mode)
        t(*inputs)
        torch_compile = time.perf_counter() - t0
        torch_ms = best_ms(t, inputs)
        print(
            f"{name} mode={mode}: eager {eager:.3f} ms, kiln {kiln_ms:.3f} ms, torch.compile "
            f"{torch_ms:.3f} ms; compile s kiln {kiln_compile:.1f}, torch {torch_compile:.1f}; "
            f"kiln max |error| vs eager {err:.3g} (largest output {ref.abs().max().item():.3g})"
        )
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile

            with torch_profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(5):
                    k(*inputs)
                torch.cuda.synchronize()
            print(p.key_averages().table(sort_by="cuda_time_total", row_limit=20))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--mode", default=None)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    compare(args.model, args.mode, args.profile)


if __name__ == "__main__":
    main()
