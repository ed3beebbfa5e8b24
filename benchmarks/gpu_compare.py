"""kiln against torch.compile on one suite model, in one process (GPU).

Builds `MODELS[name]` (benchmarks/models, size "large", bfloat16, CUDA), compiles it with kiln
and with torch.compile in the given mode, checks kiln against eager, and prints each one's best
time per call (best of 10 rounds of 50 synchronized calls, the two compilers taking turns),
the CPU time and synchronized latency of one call started on an idle device (what `kiln bench`
times), and cold compile time;
`--profile` adds the CUDA kernels kiln's call spends its time in. Unlike `kiln bench` (one
fresh process per row, three workers at once), both compilers are timed here back to back in
one quiet process, which is what a kernel-level comparison needs.

Usage: PYTHONPATH=src python3 benchmarks/gpu_compare.py MODEL [--mode reduce-overhead] [--profile]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


def model(name: str, dtype=torch.bfloat16):
    from kiln.bench.suite import load_models

    models = load_models(os.path.join(os.path.dirname(__file__), "models"))
    return models[name].factory("cuda", dtype, "large", 0)


def best_ms(fn, inputs, n: int = 50) -> float:
    """`fn`'s best time per call (ms) over 5 rounds of `n` synchronized calls."""
    return interleaved_best_ms([fn], inputs, n, rounds=5)[0]


def interleaved_best_ms(fns, inputs, n: int = 50, rounds: int = 10) -> list[float]:
    """Each function's best time per call (ms) over `rounds` rounds of `n` synchronized calls,
    the functions taking turns within a round and the order reversed every other round, so
    that a drift of the host or of the GPU's clocks reaches all of them alike."""
    for fn in fns:
        for _ in range(3):
            fn(*inputs)
    torch.cuda.synchronize()
    best = [float("inf")] * len(fns)
    for r in range(rounds):
        for i in range(len(fns)) if r % 2 == 0 else reversed(range(len(fns))):
            t0 = time.perf_counter()
            for _ in range(n):
                fns[i](*inputs)
            torch.cuda.synchronize()
            best[i] = min(best[i], (time.perf_counter() - t0) / n * 1e3)
    return best


def call_us(fn, inputs, n: int = 200) -> tuple[float, float]:
    """(median CPU microseconds until a call returns, median synchronized latency in microseconds)
    with the device idle at each call's start: what `kiln bench` times per call is the second;
    the first is the part of it the Python side (guards, wrappers, launches) costs."""
    cpu, lat = [], []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*inputs)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        cpu.append(t1 - t0)
        lat.append(time.perf_counter() - t0)
    return statistics.median(cpu) * 1e6, statistics.median(lat) * 1e6


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
        t0 = time.perf_counter()
        t = torch.compile(m, mode=mode)
        t(*inputs)
        torch_compile = time.perf_counter() - t0
        kiln_ms, torch_ms = interleaved_best_ms([k, t], inputs)
        (k_cpu, k_lat), (t_cpu, t_lat) = call_us(k, inputs), call_us(t, inputs)
        print(
            f"{name} mode={mode}: eager {eager:.3f} ms, kiln {kiln_ms:.3f} ms, torch.compile "
            f"{torch_ms:.3f} ms; compile s kiln {kiln_compile:.1f}, torch {torch_compile:.1f}; "
            f"kiln max |error| vs eager {err:.3g} (largest output {ref.abs().max().item():.3g}); "
            f"one call from an idle device: CPU us kiln {k_cpu:.0f}, torch {t_cpu:.0f}; "
            f"synchronized latency us kiln {k_lat:.0f}, torch {t_lat:.0f}"
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
