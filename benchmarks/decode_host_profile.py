"""Where a decode step's host time goes: HF Llama greedy decoding, one compiler per process.

The model, prompt and cache are `dynamic_decode.py`'s (bf16 by default). After two warm
generations it prints, for the chosen compiler:
- tokens per second of three steady generations, and the median host time of a decode step
  (the time until the step's call returns; nothing synchronizes inside a generation, so on a
  launch-bound model this is the step's cost);
- from `torch.profiler` over one generation: CUDA launches per decode step (runtime and driver
  launch calls), GPU kernel time per decode step, and the host operators by self time;
- a cProfile of one generation, sorted by own time (`--cprofile`, on by default).

    PYTHONPATH=src python3 benchmarks/decode_host_profile.py --compiler kiln
    PYTHONPATH=src python3 benchmarks/decode_host_profile.py --compiler torch

Run each compiler in its own process and compare the figures of one machine.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from dynamic_decode import build_model, new_cache, step  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


def compiled(name: str, model):
    if name == "eager":
        return model
    if name == "torch":
        return torch.compile(model, dynamic=None)
    import kiln

    return kiln.compile(model)


def generation(fn, kind, prompt, new_tokens, sync) -> tuple[float, list[float]]:
    """Seconds of one greedy generation and the host seconds of each step."""
    cache = new_cache(kind)
    ids, host = prompt, []
    sync()
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        s = time.perf_counter()
        last, cache = step(fn, kind, ids, cache)
        ids = last.argmax(dim=-1, keepdim=True)
        host.append(time.perf_counter() - s)
    sync()
    return time.perf_counter() - t0, host


def launches_and_gpu(fn, kind, prompt, new_tokens, sync) -> tuple[float, float, str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        generation(fn, kind, prompt, new_tokens, sync)
    events = prof.events()
    launches = sum(1 for e in events if "LaunchKernel" in e.name or e.name == "cuLaunchKernelEx")
    cuda = torch.autograd.DeviceType.CUDA
    gpu_us = sum(e.device_time for e in events if getattr(e, "device_type", None) == cuda)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    return launches / new_tokens, gpu_us / new_tokens, table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compiler", choices=("eager", "torch", "kiln"), required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--stand-in", action="store_true")
    p.add_argument("--no-cprofile", action="store_true")
    p.add_argument("--no-torch-profile", action="store_true")
    args = p.parse_args()
    model, kind, vocab = build_model(args, getattr(torch, args.dtype))
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocab, (1, args.prompt), generator=gen).to(args.device)
    cuda = args.device.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    fn = compiled(args.compiler, model)
    with torch.no_grad():
        t = time.perf_counter()
        generation(fn, kind, prompt, args.new_tokens, sync)
        print(f"{args.compiler}: first generation {time.perf_counter() - t:.2f} s", flush=True)
        generation(fn, kind, prompt, args.new_tokens, sync)
        for _ in range(3):
            wall, host = generation(fn, kind, prompt, args.new_tokens, sync)
            decode_host = statistics.median(host[1:]) * 1e3
            print(
                f"{args.compiler}: {args.new_tokens / wall:.1f} tokens/s, decode step host "
                f"{decode_host:.3f} ms (median), prompt step host {host[0] * 1e3:.3f} ms",
                flush=True,
            )
        if cuda and not args.no_torch_profile:
            per_step, gpu_us, table = launches_and_gpu(fn, kind, prompt, args.new_tokens, sync)
            print(f"{args.compiler}: {per_step:.1f} launches a step, GPU {gpu_us:.1f} us a step")
            print(table)
        if not args.no_cprofile:
            prof = cProfile.Profile()
            prof.enable()
            generation(fn, kind, prompt, args.new_tokens, sync)
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(45)
            print(out.getvalue())
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(45)
            print(out.getvalue())


if __name__ == "__main__":
    main()
