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
import gc
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


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
    seen: list[tuple[int, float]] = []
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            seen.append((info["generation"], time.perf_counter() - started[0]))

    gc.callbacks.append(callback)
    compiled = kiln.compile(model, backend=backend)
    cells = []
    for i in range(3):
        seen.clear()
        start = time.perf_counter()
        step(compiled)
        wall = time.perf_counter() - start
        full = sum(s for g, s in seen if g == 2)
        young = sum(s for g, s in seen if g < 2)
        cells.append(f"call {i + 1} {wall:.3f} s (full {full:.3f}, young {young:.3f})")
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
