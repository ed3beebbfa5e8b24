"""Serving with changing prompt lengths: eager, torch.compile(dynamic=None) and kiln, each in
a fresh process.

HF GPT-2 (random weights from `GPT2Config()`, no download), bf16, batch 8, lengths 128, 200,
256, 300, 384, 448, 512, three calls each under `torch.no_grad()`. For each compiler it reports
the compiles, the wall time of the 21 calls including compiles, the steady ms per length (median
of back-to-back calls, each timed with CUDA events on the GPU, `perf_counter` on the CPU),
and the largest difference from eager's logits per length; for kiln also the steady ms of a
static-shape entry compiled for each length alone (`dynamic=False`, one fresh compile per
length), which the dynamic entry should match within 10% (issue 31).

    PYTHONPATH=src python3 benchmarks/dynamic_serving.py --out results/dynamic_serving.json
    PYTHONPATH=src python3 benchmarks/dynamic_serving.py --tiny --device cpu   # smoke test

`--tiny` uses a 2-layer, 64-wide GPT-2 and short lengths; without transformers installed (or
with `--stand-in`) it uses a small causal transformer written here instead (marked "stand-in"
in the output), which only checks that the script runs.

Each compiler runs in a fresh process and compiles are counted as fresh_process.py says.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from fresh_process import compiled_for, emit, run_worker, write_json  # noqa: E402

COMPILERS = ("eager", "torch", "kiln")
LENGTHS = (128, 200, 256, 300, 384, 448, 512)
TINY_LENGTHS = (16, 20, 24, 30)


class StandIn(nn.Module):
    """A small causal transformer LM with GPT-2's call signature, for the smoke test only."""

    def __init__(self, vocab=512, dim=64, layers=2, heads=4, positions=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(positions, dim)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True)
            for _ in range(layers)
        )
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids):
        n = input_ids.shape[1]
        h = self.wte(input_ids) + self.wpe(torch.arange(n, device=input_ids.device))
        mask = torch.full((n, n), float("-inf"), device=h.device, dtype=h.dtype).triu(1)
        for block in self.blocks:
            h = block(h, src_mask=mask)
        return self.head(h)


def build_model(tiny: bool, device: str, dtype: torch.dtype, stand_in: bool = False):
    torch.manual_seed(0)
    try:
        if stand_in:
            raise ImportError("--stand-in")
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        if not tiny:
            raise SystemExit(
                "dynamic_serving.py: transformers is not installed; install it, or pass --tiny "
                "for a smoke test with a stand-in model"
            ) from None
        return StandIn().to(device, dtype).eval(), "stand-in", 512
    if tiny:
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=1024)
    else:
        cfg = GPT2Config()  # GPT-2 small: 12 layers, 768 wide, 50257 tokens
    model = GPT2LMHeadModel(cfg).to(device, dtype).eval()
    return model, "hf-gpt2" + ("-tiny" if tiny else ""), cfg.vocab_size


def logits_of(out):
    return out.logits if hasattr(out, "logits") else out


class Timer:
    """Per-call times in ms: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def per_call(self, fn, n: int) -> list[float]:
        if self.cuda:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
            ev[0].record()
            for i in range(n):
                fn()
                ev[i + 1].record()
            torch.cuda.synchronize()
            return [ev[i].elapsed_time(ev[i + 1]) for i in range(n)]
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out


def worker(args) -> dict:
    dtype = getattr(torch, args.dtype)
    model, kind, vocab = build_model(args.tiny, args.device, dtype, args.stand_in)
    lengths = TINY_LENGTHS if args.tiny else LENGTHS
    gen = torch.Generator().manual_seed(1)
    inputs = {n: torch.randint(0, vocab, (args.batch, n), generator=gen) for n in lengths}
    inputs = {n: x.to(args.device) for n, x in inputs.items()}
    timer = Timer(args.device)
    with torch.no_grad():
        ref = {n: logits_of(model(input_ids=x)).float() for n, x in inputs.items()}
    fn, compile_counts = compiled_for(args.only, model)
    timer.sync()
    diffs = {}
    with torch.no_grad():
        t0 = time.perf_counter()
        for n in lengths:
            for _ in range(args.calls):
                out = logits_of(fn(input_ids=inputs[n]))
            timer.sync()
            diffs[n] = (out.float() - ref[n]).abs().max().item()
        wall = time.perf_counter() - t0
        counts = compile_counts()  # before kiln's per-length static entries add their own
        # kiln: a static entry per length (dynamic=False), compiled and warmed now, so that the
        # rounds below time it right after the dynamic entry at the same length
        statics = (
            static_entries(model, inputs) if args.only == "kiln" and not args.no_static else {}
        )
        timer.sync()
        # lengths interleaved over rounds, so a slow moment of the host weighs on every length
        # (the host-bound lengths swing by 20% between moments on the device machine's host)
        times: dict[int, list[float]] = {n: [] for n in lengths}
        static_times: dict[int, list[float]] = {n: [] for n in statics}
        for _ in range(args.rounds):
            for n in lengths:
                x = inputs[n]
                times[n] += timer.per_call(lambda x=x: fn(input_ids=x), args.reps)
                if n in statics:
                    st = statics[n]
                    static_times[n] += timer.per_call(lambda x=x, st=st: st(input_ids=x), args.reps)
        steady = {n: round(statistics.median(ts), 4) for n, ts in times.items()}
    result = {
        "compiler": args.only,
        "model": kind,
        "device": args.device,
        "dtype": args.dtype,
        "batch": args.batch,
        "lengths": list(lengths),
        "calls_per_length": args.calls,
        "rounds": args.rounds,
        "reps": args.reps,
        "wall_s_with_compiles": round(wall, 3),
        "steady_ms": steady,
        "max_abs_diff_vs_eager": diffs,
    }
    result.update(counts)
    if static_times:
        result["static_entry_steady_ms"] = {
            n: round(statistics.median(ts), 4) for n, ts in static_times.items()
        }
    return result


def static_entries(model, inputs) -> dict:
    """A kiln entry compiled for each length alone (`dynamic=False`, its own compiled callable),
    warmed with three calls."""
    import kiln

    statics = {}
    with torch.no_grad():
        for n, x in inputs.items():
            fn = kiln.compile(model, dynamic=False)
            for _ in range(3):
                fn(input_ids=x)
            statics[n] = fn
    return statics


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--reps", type=int, default=20, help="back-to-back calls timed per length")
    p.add_argument("--rounds", type=int, default=3, help="rounds over the lengths (interleaved)")
    p.add_argument("--tiny", action="store_true", help="a tiny model and lengths: smoke test")
    p.add_argument("--stand-in", action="store_true", help="with --tiny: the stand-in model")
    p.add_argument("--no-static", action="store_true", help="skip kiln's per-length entries")
    p.add_argument("--compilers", default=",".join(COMPILERS))
    p.add_argument("--out", default=None, help="write the JSON results here")
    p.add_argument("--only", choices=COMPILERS, help=argparse.SUPPRESS)  # the worker process
    args = p.parse_args()
    if args.only:
        emit(worker(args))
        return
    results = []
    for name in args.compilers.split(","):
        argv = ["--only", name, "--device", args.device, "--dtype", args.dtype]
        argv += ["--batch", str(args.batch), "--calls", str(args.calls), "--reps", str(args.reps)]
        argv += ["--rounds", str(args.rounds)]
        argv += ["--tiny"] * args.tiny + ["--no-static"] * args.no_static
        argv += ["--stand-in"] * args.stand_in
        results.append(run_worker(__file__, argv, {"compiler": name}))
        print(json.dumps(results[-1]), flush=True)
    write_json(args.out, "dynamic_serving", results)


if __name__ == "__main__":
    main()
