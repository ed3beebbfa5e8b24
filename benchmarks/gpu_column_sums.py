"""Column sums on the GPU (a linear layer's bias gradient, a layer norm's weight gradient), by
the split reduction's target number of programs (codegen/triton/heuristics.py).

For each shape, `x.sum(0)` of a float32 [rows, columns] matrix: torch.compile's and eager's GPU
time, then kiln's under each `SPLIT_TARGET_PROGRAMS` (and `SPLIT_RBLOCK`) tried, with the
largest difference from a float64 sum. GPU time is the profiler's kernel time per call (all
kernels of the call, the split's finishing kernel included), so Python's call overhead does
not count.

Usage: PYTHONPATH=src python3 benchmarks/gpu_column_sums.py [--targets 512,2048,4096]
"""

from __future__ import annotations

import argparse

import torch

SHAPES = [(8192, 3072), (8192, 2304), (8192, 768)]


def gpu_us(fn, x, calls: int = 20) -> float:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return sum(e.device_time for e in prof.events() if e.device_type == cuda) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="512,1024,2048,4096")
    ap.add_argument("--rblocks", default="64")
    args = ap.parse_args()
    import kiln
    import kiln.codegen.triton.heuristics as heuristics

    xs = {s: torch.randn(*s, device="cuda") for s in SHAPES}
    exact = {s: xs[s].double().sum(0) for s in SHAPES}
    for s in SHAPES:
        compiled = torch.compile(eval("lambda x: x.sum(0)"))  # a function of its own each time
        eager = gpu_us(lambda x: x.sum(0), xs[s])
        print(f"{s}: torch.compile {gpu_us(compiled, xs[s]):.1f} us, eager {eager:.1f} us")
    for target in (int(t) for t in args.targets.split(",")):
        for rblock in (int(r) for r in args.rblocks.split(",")):
            heuristics.SPLIT_TARGET_PROGRAMS, heuristics.SPLIT_RBLOCK = target, rblock
            row = []
            for s in SHAPES:
                fn = kiln.compile(eval("lambda x: x.sum(0)"))  # a new capture: the new plan
                err = (fn(xs[s]).double() - exact[s]).abs().max().item()
                row.append(f"{s[1]} columns {gpu_us(fn, xs[s]):.1f} us (max diff {err:.1e})")
            print(f"kiln, {target} programs, RBLOCK {rblock}: " + ", ".join(row))


if __name__ == "__main__":
    main()
