"""Host time per call of kiln's dynamic entry against a static entry, HF GPT-2 on CUDA.

GPT-2 small (bf16, random weights, batch 8) is compiled twice in one process: with the default
policy, called at lengths 128, 200 and 256 (a static entry, then one dynamic entry), and with
`dynamic=False` at length 256 alone. For each it prints, three times, the host time per call of
50 back-to-back calls at length 256 (time until the last call returns) and the wall time per
call (until the GPU is done); a launch-bound model has the two equal. Then a cProfile of 50
calls, sorted by own time, shows where the host time goes (launch paths, ATen calls).

    PYTHONPATH=src python3 benchmarks/dynamic_host_profile.py
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
import kiln  # noqa: E402


def host_and_wall_ms(fn, x, n: int = 50) -> tuple[float, float]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn(input_ids=x)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e3, (t2 - t0) / n * 1e3


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("dynamic_host_profile.py measures CUDA launches: run it on a GPU")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda().to(torch.bfloat16).eval()
    ids = {n: torch.randint(0, 50257, (8, n), device="cuda") for n in (128, 200, 256)}
    for label, dynamic in (("dynamic", None), ("static", False)):
        kiln.reset()
        fn = kiln.compile(model, dynamic=dynamic)
        with torch.no_grad():
            for n in (128, 200, 256) if dynamic is None else (256,):
                fn(input_ids=ids[n])
            for _ in range(3):
                fn(input_ids=ids[256])
            for _ in range(3):
                host, wall = host_and_wall_ms(fn, ids[256])
                print(f"{label}: host {host:.3f} ms/call, wall {wall:.3f} ms/call", flush=True)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(50):
                fn(input_ids=ids[256])
            prof.disable()
            torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        print(label, "compiled entries:", fn._kiln_compiled.compiles)
        print(out.getvalue(), flush=True)


if __name__ == "__main__":
    main()
