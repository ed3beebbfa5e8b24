"""Training steps as users write them, compiled end to end: model, loss and optimizer step.

Three scenarios (issue "Real training code compiles"), each run for one compiler in a fresh
process, on CUDA when present:

  gpt2   HF GPT2LMHeadModel (6 layers, d768, float32, batch 8 x 512, `labels=` so the loss is
         computed inside the model), AdamW; the compiled model and the compiled `opt.step`
  adamw  AdamW alone over GPT-2-small's parameter shapes (124M parameters), random gradients;
         `opt.step` compiled; `--compiler fused` is eager `AdamW(fused=True)`
  seeds  the seeds' loop: Linear 128->256, ReLU, Linear 256->10, Adam, CrossEntropyLoss,
         batch 32, mode="reduce-overhead", optimizer step compiled too

Each run records the loss (or a parameter checksum) of every step, so runs of different
compilers from the same seed can be compared, and times the steps after a warm-up as a training
loop runs them: back-to-back, each step timed with CUDA events, median reported; the first step
(compile included) is timed alone. On CUDA the peak of allocated memory
(`max_memory_allocated`) is reported for the first step and for the later ones apart (kiln's
first step is its trace, the user's code run for real), and the larger as `peak_mib`. `--all`
runs every compiler of a scenario (or those `--compilers` names) in its own process and prints a
table with the loss curves' largest difference from eager's.

Usage: PYTHONPATH=src python benchmarks/train_steps.py --all gpt2 [--steps 20] [--json out.json]
       [--compilers eager,kiln]
       PYTHONPATH=src python benchmarks/train_steps.py --scenario adamw --compiler kiln
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

COMPILERS = {
    "gpt2": ("eager", "torch", "kiln"),
    "adamw": ("eager", "fused", "torch", "kiln"),
    "seeds": ("eager", "torch", "kiln"),
}


def _compile(compiler: str, fn, **kw):
    if compiler == "torch":
        import torch

        return torch.compile(fn, **kw)
    if compiler == "kiln":
        import kiln

        return kiln.compile(fn, **kw)
    return fn


def _gpt2(compiler: str, device: str, steps: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=1024)
    model = GPT2LMHeadModel(cfg).to(device).train()
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    cmodel = _compile(compiler, model)
    cstep = _compile(compiler, opt.step)
    gen = torch.Generator(device="cpu").manual_seed(1)
    batches = [torch.randint(0, cfg.vocab_size, (8, 512), generator=gen) for _ in range(4)]
    batches = [b.to(device) for b in batches]

    def step(i):
        ids = batches[i % len(batches)]
        loss = cmodel(input_ids=ids, labels=ids).loss
        loss.backward()
        cstep()
        opt.zero_grad(set_to_none=True)
        return loss

    return step, lambda loss: float(loss)


def _adamw(compiler: str, device: str, steps: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    shapes = [p.shape for p in GPT2LMHeadModel(GPT2Config()).parameters()]
    params = [torch.randn(s, device=device, requires_grad=True) for s in shapes]
    gen = torch.Generator(device=device).manual_seed(2)
    for p in params:
        p.grad = torch.randn(p.shape, device=device, generator=gen) * 1e-2
    opt = torch.optim.AdamW(params, lr=1e-3, fused=compiler == "fused")
    cstep = _compile(compiler if compiler != "fused" else "eager", opt.step)

    def step(i):
        cstep()
        return params[0]

    return step, lambda p: float(p.detach().double().sum())


def _seeds(compiler: str, device: str, steps: int):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    ).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    kw = {"mode": "reduce-overhead"} if compiler != "eager" else {}
    cmodel = _compile(compiler, model, **kw)
    cstep = _compile(compiler, opt.step)
    gen = torch.Generator(device="cpu").manual_seed(3)
    data = [
        (torch.randn(32, 128, generator=gen), torch.randint(0, 10, (32,), generator=gen))
        for _ in range(8)
    ]
    data = [(x.to(device), y.to(device)) for x, y in data]

    def step(i):
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(cmodel(x), y)
        loss.backward()
        cstep()
        return loss

    return step, lambda loss: float(loss)


SCENARIOS = {"gpt2": _gpt2, "adamw": _adamw, "seeds": _seeds}


def run_one(scenario: str, compiler: str, steps: int, timed: int, profile=False) -> dict:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    step, value = SCENARIOS[scenario](compiler, device, steps)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    curve, first, first_peak = [], None, None
    for i in range(steps):
        sync()
        t = time.perf_counter()
        out = step(i)
        curve.append(value(out))
        sync()
        if first is None:
            first = time.perf_counter() - t
            if device == "cuda":  # the first step (the compile) apart from the steady ones
                first_peak = torch.cuda.max_memory_allocated() / 2**20
                torch.cuda.reset_peak_memory_stats()
    ms = []
    for i in range(timed):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(steps + i)
            end.record()
            end.synchronize()
            ms.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            step(steps + i)
            ms.append((time.perf_counter() - t) * 1e3)
    out = {
        "scenario": scenario,
        "compiler": compiler,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "first_step_s": first,
        "step_ms_median": statistics.median(ms),
        "curve": curve,
        "peak_mib": None,
        "peak_first_step_mib": first_peak,
        "peak_later_steps_mib": None,
    }
    if device == "cuda":  # allocated bytes (tensors), not the caching allocator's reserve
        later = torch.cuda.max_memory_allocated() / 2**20
        out["peak_later_steps_mib"] = later
        out["peak_mib"] = max(later, first_peak or 0.0)
    if compiler == "kiln":
        from kiln.backends.builtin import fallbacks

        out["fallbacks"] = [str(f) for f in fallbacks()]
    if profile:
        _profile(step, steps + timed, device)
    return out


def _profile(step, start: int, device: str, n: int = 50) -> None:
    """Where a steady step's host time goes: cProfile's top functions and, on CUDA, the runtime
    calls (launches, graph replays, copies, syncs) per step from torch.profiler; to stderr."""
    import cProfile
    import pstats

    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    for i in range(n):
        step(start + i)
    prof.disable()
    sync()
    print(
        f"profile: {n} steps, {(time.perf_counter() - t) * 1e3 / n:.3f} ms a step", file=sys.stderr
    )
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as tp:
        for i in range(n):
            step(start + n + i)
        sync()
    rows = sorted(tp.key_averages(), key=lambda e: -e.count)
    print(f"torch.profiler, calls per step over {n} steps:", file=sys.stderr)
    for e in rows[:40]:
        print(f"  {e.count / n:7.2f}  {e.key[:90]}", file=sys.stderr)


def run_all(scenario: str, steps: int, timed: int, compilers=None) -> list[dict]:
    rows = []
    for compiler in compilers or COMPILERS[scenario]:
        cmd = [sys.executable, __file__, "--scenario", scenario, "--compiler", compiler]
        cmd += ["--steps", str(steps), "--timed", str(timed), "--print-json"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            rows.append({"scenario": scenario, "compiler": compiler, "error": proc.stderr[-2000:]})
            continue
        row = json.loads(lines[-1])
        row["eager_warnings"] = [ln for ln in proc.stderr.splitlines() if "eager" in ln.lower()]
        rows.append(row)
    ref = next((r for r in rows if r.get("compiler") == "eager" and "curve" in r), None)
    for r in rows:
        if ref is not None and "curve" in r:
            diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(r["curve"], ref["curve"])]
            r["curve_max_rel_diff"] = max(diffs)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--compiler", default="kiln")
    ap.add_argument("--all", choices=sorted(SCENARIOS))
    ap.add_argument("--compilers", help="with --all: a comma-separated subset (default all)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--timed", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--print-json", action="store_true")
    ap.add_argument("--profile", action="store_true", help="one compiler: profile 50 more steps")
    args = ap.parse_args()
    if args.all:
        chosen = args.compilers.split(",") if args.compilers else None
        rows = run_all(args.all, args.steps, args.timed, chosen)
        for r in rows:
            if "error" in r:
                print(f"{r['compiler']:6s} FAILED: {r['error'][-600:]}")
                continue
            print(
                f"{r['compiler']:6s} step {r['step_ms_median']:8.3f} ms (median of {args.timed})"
                f"  first {r['first_step_s']:6.2f} s  peak {r['peak_mib'] or 0:8.1f} MiB"
                f" (first step {r['peak_first_step_mib'] or 0:.1f}, later steps "
                f"{r['peak_later_steps_mib'] or 0:.1f})"
                f"  curve max rel diff {r.get('curve_max_rel_diff', 0):.2e}"
                f"  fallbacks {len(r.get('fallbacks', []))}  eager warnings "
                f"{len(r.get('eager_warnings', []))}"
            )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return 0
    row = run_one(args.scenario, args.compiler, args.steps, args.timed, args.profile)
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
