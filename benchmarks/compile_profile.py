"""Where kiln's cold compile time goes, for one suite model (GPU or CPU).

Builds `MODELS[name]` (benchmarks/models, size "large", bfloat16 on CUDA, float32 on the CPU),
runs it eagerly once (so CUDA and cuBLAS start-up are not counted, as in `kiln bench`), then
profiles `kiln.compile(model, mode=...)` and its first call with cProfile, in a fresh cache
folder. Prints the wall time of that cold first call, the functions that take most of it
(cumulative, main thread; time the compile workers spend shows as waiting in `run`), and
Triton's builder counters.

Usage: PYTHONPATH=src python3 benchmarks/compile_profile.py MODEL [--mode M] [--top N]
       [--device cpu|cuda] [--train]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--mode", default=None)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--device", default=None)
    ap.add_argument("--train", action="store_true")
    args = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="kiln-compile-profile-")
    for var in ("KILN_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        os.environ[var] = os.path.join(cache, var.lower())
    sys.path.insert(0, os.path.join(ROOT, "src"))
    import torch

    import kiln
    from kiln.bench.suite import load_models
    from kiln.runtime import triton_builder

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    models = load_models(os.path.join(ROOT, "benchmarks", "models"))
    model, inputs = models[args.model].factory(device, dtype, "large", 0)
    model.train(args.train)

    def step(fn):
        out = fn(*inputs)
        if args.train:
            loss = sum(o.float().sum() for o in (out if isinstance(out, tuple) else (out,)))
            loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()

    with torch.set_grad_enabled(args.train):
        step(model)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        compiled = kiln.compile(model, mode=args.mode)
        step(compiled)
        prof.disable()
        wall = time.perf_counter() - t0
    print(f"{args.model} mode={args.mode} device={device}: cold compile + first call {wall:.2f} s")
    print(f"triton builder: {triton_builder.STATS}")
    stats = pstats.Stats(prof)
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
