"""Where kiln's cold compile time goes, for one suite model (GPU or CPU).

Builds `MODELS[name]` (benchmarks/models, size "large", bfloat16 on CUDA and float32 on the CPU
unless `--dtype` says otherwise), runs it eagerly once (so CUDA and cuBLAS start-up are not
counted, as in `kiln bench`), then profiles `kiln.compile(model, mode=...)` and its first call
with cProfile, in a fresh cache folder. Prints the wall time of that cold first call, the
functions that take most of it (cumulative, main thread; time the compile workers spend shows
as waiting in `run`), and Triton's builder counters.

Usage: PYTHONPATH=src python3 benchmarks/compile_profile.py MODEL [--mode M] [--top N]
       [--device cpu|cuda] [--train] [--dtype float32|bfloat16|float16]
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


def cold_model(name: str, device: str, dtype: str, train: bool, prefix: str):
    """Fresh, empty cache folders; suite model `name` (size "large") built and run once
    eagerly, so CUDA and cuBLAS start-up are not counted, as in `kiln bench`. Gives the model
    and `step(fn)`: one call of `fn` on the model's inputs (with backward when `train`),
    synchronized."""
    cache = tempfile.mkdtemp(prefix=prefix)
    for var in ("KILN_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        os.environ[var] = os.path.join(cache, var.lower())
    sys.path.insert(0, os.path.join(ROOT, "src"))
    import torch

    from kiln.bench.suite import load_models

    models = load_models(os.path.join(ROOT, "benchmarks", "models"))
    model, inputs = models[name].factory(device, getattr(torch, dtype), "large", 0)
    model.train(train)

    def step(fn):
        with torch.set_grad_enabled(train):
            out = fn(*inputs)
            if train:
                sum(o.float().sum() for o in (out if isinstance(out, tuple) else (out,))).backward()
        if device == "cuda":
            torch.cuda.synchronize()

    step(model)
    return model, step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--mode", default=None)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--device", default=None)
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    args = ap.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    model, step = cold_model(args.model, device, dtype, args.train, "kiln-compile-profile-")
    import kiln
    from kiln.runtime import triton_builder

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
