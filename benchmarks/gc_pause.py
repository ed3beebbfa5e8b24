"""What pausing the garbage collector during a compile saves, and whether the work comes back later.

Runs nanoGPT's training step three times through `kiln.compile`, each run in a fresh process,
with kiln's pause (kiln/gc_pause.py) and with it switched off, alternating; prints each call's
wall time and the seconds of full (generation 2) and young collections inside it (`gc.callbacks`).
If the pause only postponed the collector's work, the second and third calls of the paused
runs would carry it.

Usage: PYTHONPATH=src python benchmarks/gc_pause.py [--runs 2] [--size small] [--backend aot_eager]
       [--device cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compile_phases import full_and_young, time_collections  # noqa: E402


def child(size: str, backend: str, device: str, pause: bool) -> None:
    sys.path.insert(0, os.path.join(HERE, "..", "src"))
    import torch

    import kiln
    from kiln.bench.suite import load_models

    model, inputs = load_models(os.path.join(HERE, "models"))["nanogpt"].factory(
        device, torch.float32, size, 0
    )
    model.train(True)

    def step(fn) -> None:
        for p in model.parameters():
            p.grad = None
        fn(*inputs).float().sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()

    step(model)  # eager once: the first call's own start-up is not the compile's
    if not pause:
        import kiln.autograd.compile as aot
        import kiln.capture.frontend as frontend

        frontend.paused_gc = aot.paused_gc = contextlib.nullcontext
    seen = time_collections()
    compiled = kiln.compile(model, backend=backend)
    cells = []
    for i in range(3):
        seen.clear()
        start = time.perf_counter()
        step(compiled)
        wall = time.perf_counter() - start
        full, young = full_and_young(seen)
        cells.append(f"call {i + 1} {wall:.3f} s (full {sum(full):.3f}, young {sum(young):.3f})")
    print(("paused   " if pause else "unpaused ") + " | ".join(cells), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--size", default="small")
    ap.add_argument("--backend", default="aot_eager")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--child", choices=("paused", "unpaused"))
    args = ap.parse_args()
    if args.child:
        child(args.size, args.backend, args.device, args.child == "paused")
        return
    for _ in range(args.runs):
        for which in ("paused", "unpaused"):
            argv = [sys.executable, __file__, "--child", which, "--size", args.size]
            subprocess.run(argv + ["--backend", args.backend, "--device", args.device], check=True)


if __name__ == "__main__":
    main()
