"""Where kiln's time goes on one suite model (GPU): compile phases, call CPU time, kernels.

Writes one text report per model to `--out`: a cProfile of kiln's cold first call (compile),
kiln's and torch.compile's best time per call, a cProfile of kiln's steady-state calls (the
Python a call runs: guards, wrappers, launches), and the CUDA kernels each compiler's call
spends GPU time in (summed per kernel name, per call). With `--code`, kiln's generated code
(`KILN_LOGS=output_code`) goes to `MODEL.code.txt` beside it. Cache directories are the
caller's: point KILN_CACHE_DIR / TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR at empty folders
for a cold compile.

Usage: PYTHONPATH=src python3 benchmarks/gpu_profile.py MODEL [MODEL ...] --out DIR
       [--mode reduce-overhead] [--code] [--no-torch]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from gpu_compare import best_ms, model  # noqa: E402


def _stats(prof: cProfile.Profile, key: str, limit: int) -> str:
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats(key).print_stats(limit)
    return s.getvalue()


def _kernel_table(fn, inputs, calls: int = 10, rows_shown: int = 30) -> tuple[float, str]:
    """GPU microseconds per call and the top kernels, from torch.profiler's CUDA activity."""
    from torch.profiler import ProfilerActivity, profile

    fn(*inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            fn(*inputs)
        torch.cuda.synchronize()
    rows = {}
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name[:90]
            t, n = rows.get(name, (0.0, 0))
            rows[name] = (t + e.device_time, n + 1)
    total = sum(t for t, _ in rows.values()) / calls
    lines = [f"{'us/call':>9} {'n/call':>7}  kernel"]
    for name, (t, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:rows_shown]:
        lines.append(f"{t / calls:9.1f} {n / calls:7.1f}  {name}")
    lines.append(f"kernels per call: {sum(n for _, n in rows.values()) / calls:.1f}")
    return total, "\n".join(lines)


def report(name: str, mode: str | None, out: str, code: bool, with_torch: bool) -> None:
    import kiln

    handler = None
    if code:
        handler = logging.FileHandler(os.path.join(out, f"{name}.code.txt"), mode="w")
        logging.getLogger("kiln").addHandler(handler)
        kiln.set_logs("output_code", "perf_hints", "graph_breaks")
    m, inputs = model(name)
    parts = [f"# {name}, mode={mode}, torch {torch.__version__}"]
    with torch.no_grad():
        ref = m(*inputs)
        eager = best_ms(m, inputs)
        k = kiln.compile(m, mode=mode)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        got = k(*inputs)
        torch.cuda.synchronize()
        prof.disable()
        compile_s = time.perf_counter() - t0
        if handler is not None:
            logging.getLogger("kiln").removeHandler(handler)
            handler.close()
            kiln.set_logs()
        err = (got.float() - ref.float()).abs().max().item()
        parts.append(f"kiln cold first call {compile_s:.2f} s, max |error| vs eager {err:.3g}")
        parts.append("## compile, cumulative\n" + _stats(prof, "cumulative", 45))
        parts.append("## compile, tottime\n" + _stats(prof, "tottime", 25))
        kiln_ms = best_ms(k, inputs)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(30):
            k(*inputs)
        torch.cuda.synchronize()
        prof.disable()
        parts.append("## kiln call (30 calls), tottime\n" + _stats(prof, "tottime", 30))
        gpu_us, table = _kernel_table(k, inputs, rows_shown=80)
        parts.append(f"## kiln kernels: {gpu_us:.1f} us GPU per call\n{table}")
        line = f"eager {eager:.3f} ms, kiln {kiln_ms:.3f} ms (GPU {gpu_us / 1e3:.3f} ms)"
        if with_torch:
            t = torch.compile(m, mode=mode)
            t0 = time.perf_counter()
            t(*inputs)
            torch_compile = time.perf_counter() - t0
            torch_ms = best_ms(t, inputs)
            tgpu, ttable = _kernel_table(t, inputs, rows_shown=80)
            parts.append(f"## torch.compile kernels: {tgpu:.1f} us GPU per call\n{ttable}")
            line += (
                f", torch.compile {torch_ms:.3f} ms (GPU {tgpu / 1e3:.3f} ms); cold compile s "
                f"kiln {compile_s:.1f}, torch {torch_compile:.1f}"
            )
        parts.insert(1, line)
        print(f"{name} mode={mode}: {line}", flush=True)
    with open(os.path.join(out, f"{name}.{mode or 'default'}.txt"), "w") as f:
        f.write("\n\n".join(parts) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", default=None)
    ap.add_argument("--code", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in args.models:
        report(name, args.mode, args.out, args.code, not args.no_torch)


if __name__ == "__main__":
    main()
