"""One AdamW step over GPT-2-small's parameters: eager foreach, eager fused, torch.compile, kiln.

The 148 parameter shapes of GPT-2 small (124M parameters; `--scale k` divides the model width
and the vocabulary by k for a quick CPU run), float32, random gradients. Four optimizers over
four copies of the same parameters and gradients:

  eager    torch.optim.AdamW(foreach=True), eager
  fused    torch.optim.AdamW(fused=True), eager (CUDA only: the CPU has no fused AdamW for
           float32 parameters before torch 2.4; here it runs wherever torch has it)
  torch    torch.compile(opt.step) over a foreach AdamW
  kiln     kiln.compile(opt.step) over a foreach AdamW

Correctness first: `--check` steps from the same start, then each variant's parameters and
state are compared with eager's (largest absolute difference reported; `ok` means
`torch.allclose(rtol=1e-5, atol=1e-6)`). Then timing: on CUDA, back-to-back steps timed with
CUDA events (kiln.bench.measure.back_to_back_medians: blocks alternating between variants,
medians in ms); on the CPU, wall-clock medians of single steps. The first compiled call of each
compiler is timed alone (compile time). JSON with everything goes to `--json`.

`--profile` then profiles 10 steady steps of the last compiled variant (kiln unless left out)
with torch.profiler: the top device kernels and host ops, kernel launches and ATen calls per
step, and the host time a step takes to return (launch-bound steps on a GPU: the whole cost).

Usage: PYTHONPATH=src python benchmarks/optimizer_step.py [--scale 1] [--json out.json]
       PYTHONPATH=src python benchmarks/optimizer_step.py --scale 16 --variants eager,kiln
       PYTHONPATH=src python benchmarks/optimizer_step.py --variants eager,fused,kiln --profile
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def gpt2_small_shapes(scale: int = 1) -> list[tuple[int, ...]]:
    """GPT2LMHeadModel(GPT2Config()).parameters() shapes (lm_head is tied to wte)."""
    d, vocab, pos = 768 // scale, 50257 // scale, 1024 // scale
    shapes: list[tuple[int, ...]] = [(vocab, d), (pos, d)]
    for _ in range(12):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,)]  # ln_1, attn
        shapes += [(d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]  # ln_2, mlp
    return shapes + [(d,), (d,)]  # ln_f


def _make(variant: str, shapes, device: str):
    import torch

    gen = torch.Generator(device="cpu").manual_seed(0)
    params = [torch.randn(s, generator=gen).to(device).requires_grad_() for s in shapes]
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * 1e-2).to(device)
    kw = {"fused": True} if variant == "fused" else {"foreach": True}
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **kw)
    if variant == "torch":
        step = torch.compile(opt.step)
    elif variant == "kiln":
        import kiln

        step = kiln.compile(opt.step)
    else:
        step = opt.step
    return params, opt, step


def _max_diff(ref, ref_opt, params, opt) -> float:
    worst = 0.0
    for a, b in zip(ref, params):
        worst = max(worst, float((a.detach() - b.detach()).abs().max()))
        for k, v in ref_opt.state[a].items():
            worst = max(worst, float((v.double() - opt.state[b][k].double()).abs().max()))
    return worst


def _same(ref, ref_opt, params, opt) -> bool:
    import torch

    for a, b in zip(ref, params):
        if not torch.allclose(a.detach(), b.detach(), rtol=1e-5, atol=1e-6):
            return False
        for k, v in ref_opt.state[a].items():
            if not torch.allclose(v.double(), opt.state[b][k].double(), rtol=1e-5, atol=1e-6):
                return False
    return True


def _profile(name: str, step, device: str, steps: int = 10) -> dict:
    """torch.profiler over `steps` steady calls of `step` (see the module doc); prints the
    tables and gives the per-step counts."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        step()
    sync()
    host = []
    for _ in range(steps):  # host time alone: no sync inside the timed call
        t = time.perf_counter()
        step()
        host.append((time.perf_counter() - t) * 1e3)
        sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    events = prof.key_averages()
    launch_names = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")
    launches = sum(e.count for e in events if e.key in launch_names)
    aten = sum(e.count for e in events if e.key.startswith("aten::"))
    syncs = sum(
        e.count
        for e in events
        if "Synchronize" in e.key or e.key in ("aten::item", "aten::_local_scalar_dense")
    )
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    print(f"--- {name}: {steps} steady steps, top ops by {sort} ---")
    print(events.table(sort_by=sort, row_limit=15, max_name_column_width=60))
    if cuda:
        print("--- host side (self CPU time) ---")
        print(events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
    out = {
        "kernel_launches_per_step": launches / steps,
        "aten_calls_per_step": aten / steps,
        "syncs_and_item_per_step": syncs / steps,
        "host_ms_per_step_median": round(statistics.median(host), 4),
    }
    print(f"{name} per step: " + ", ".join(f"{k} {v}" for k, v in out.items()), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=1, help="divide width and vocabulary by this")
    ap.add_argument("--variants", default="eager,fused,torch,kiln")
    ap.add_argument("--check", type=int, default=3, help="steps compared with eager's")
    ap.add_argument("--calls", type=int, default=20, help="CPU: timed steps per variant")
    ap.add_argument("--profile", action="store_true", help="profile the last compiled variant")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = gpt2_small_shapes(args.scale)
    variants = args.variants.split(",")
    if "eager" not in variants:
        variants.insert(0, "eager")  # the reference
    made = {v: _make(v, shapes, device) for v in variants}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    first: dict[str, float] = {}
    for _ in range(args.check):
        for v, (_, _, step) in made.items():
            sync()
            t = time.perf_counter()
            step()
            sync()
            if v not in first:  # printed at once: a run cut short still shows compile times
                first[v] = time.perf_counter() - t
                print(f"{v:6s} first call {first[v]:8.3f} s", flush=True)
    ref, ref_opt, _ = made["eager"]
    result: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "params": len(shapes),
        "numel": sum(int(torch.Size(s).numel()) for s in shapes),
        "scale": args.scale,
        "variants": {},
    }
    for v, (params, opt, _) in made.items():
        result["variants"][v] = {
            "first_call_s": round(first[v], 4),
            "max_abs_diff_vs_eager": _max_diff(ref, ref_opt, params, opt),
            "equal_to_eager": _same(ref, ref_opt, params, opt),
        }
    steps = [lambda _x, s=made[v][2]: s() for v in variants]
    if device == "cuda":
        from kiln.bench.measure import back_to_back_medians

        medians = back_to_back_medians(steps, ())
    else:
        medians = []
        for s in steps:
            for _ in range(3):
                s(())
            times = []
            for _ in range(args.calls):
                t = time.perf_counter()
                s(())
                times.append((time.perf_counter() - t) * 1e3)
            medians.append(statistics.median(times))
    for v, ms in zip(variants, medians):
        result["variants"][v]["step_ms"] = round(ms, 4)
    for v, r in result["variants"].items():
        print(
            f"{v:6s} step {r['step_ms']:9.3f} ms  first call {r['first_call_s']:8.3f} s  "
            f"max |diff| vs eager {r['max_abs_diff_vs_eager']:.2e}  equal: {r['equal_to_eager']}",
            flush=True,
        )
    if args.profile:
        compiled = [v for v in variants if v in ("kiln", "torch")] or variants[-1:]
        name = "kiln" if "kiln" in compiled else compiled[-1]
        result["profile"] = _profile(name, made[name][2], device)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(0 if all(r["equal_to_eager"] for r in result["variants"].values()) else 1)


if __name__ == "__main__":
    main()
