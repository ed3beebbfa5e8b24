"""Peak CPU memory of each training step, first step included: eager, torch.compile and kiln
counted the same way, alone or under DDP (2 gloo processes).

The step: HF GPT2LMHeadModel from a small config (`labels=`, the loss inside the model), AdamW,
the model and `opt.step` compiled, `zero_grad(set_to_none=True)`. The count: the profiler's
memory events (`torch.profiler.profile(profile_memory=True)`), every allocation and free of the
CPU allocator whoever makes it (eager kernels, torch.compile's and kiln's wrappers, kiln's arena
blocks), summed from the start of the first step: bytes alive above the model and the batches,
so the optimizer's state and whatever a compiler keeps between calls count as the CUDA
allocator's `max_memory_allocated` would count them. (`memory_breakdown.py --step` counts
through a dispatch mode, which torch.compile's first call runs outside of: it cannot show
torch.compile's CPU peaks.)

Prints, per compiler, each phase's peak and end (MiB) of the first step and of the last, and
the largest difference of its losses from eager's.

Usage: PYTHONPATH=src python3 benchmarks/cpu_step_peaks.py [--compilers eager,torch,kiln]
       [--steps 3] [--ddp] [--layers 2] [--json out.json]
Each compiler runs in its own process (`--one COMPILER`); with --ddp, two gloo ranks of it
(rank 0's figures are shown).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

MIB = 2**20
PHASES = ("forward", "backward", "opt_step", "zero_grad")


def _model(layers: int):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    cfg = GPT2Config(
        n_layer=layers,
        n_embd=128,
        n_head=4,
        n_positions=256,
        resid_pdrop=0.0,  # one RNG stream for every compiler: losses compare
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    cfg.loss_type = "ForCausalLM"
    model = GPT2LMHeadModel(cfg).train()
    model.config.use_cache = False
    return model, cfg.vocab_size


def _compile(compiler: str, fn):
    if compiler == "kiln":
        import kiln

        return kiln.compile(fn)
    if compiler == "torch":
        return torch.compile(fn)
    return fn


def run(compiler: str, steps: int, layers: int, rank: int = 0) -> dict:
    torch.manual_seed(0)
    model, vocab = _model(layers)
    if torch.distributed.is_initialized():
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fn, opt_step = _compile(compiler, model), _compile(compiler, opt.step)
    gen = torch.Generator().manual_seed(1 + rank)
    batches = [torch.randint(0, vocab, (2, 128), generator=gen) for _ in range(steps)]
    losses = []
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    )
    with prof:
        for i, ids in enumerate(batches):
            with torch.profiler.record_function(f"kiln_step{i}.forward"):
                loss = fn(input_ids=ids, labels=ids).loss
            with torch.profiler.record_function(f"kiln_step{i}.backward"):
                loss.backward()
            with torch.profiler.record_function(f"kiln_step{i}.opt_step"):
                opt_step()
            with torch.profiler.record_function(f"kiln_step{i}.zero_grad"):
                opt.zero_grad(set_to_none=True)
                losses.append(float(loss))
                del loss
    return {"compiler": compiler, "losses": losses, "steps": _phases(prof, steps)}


def _phases(prof, steps: int) -> list[dict]:
    """Per step, {phase: (peak, end)} in bytes alive since profiling began."""
    events = prof.profiler.kineto_results.events()
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    spans = {
        e.name(): (e.start_ns(), e.end_ns())
        for e in events
        if e.name().startswith("kiln_step") and "." in e.name()
    }
    out: list[dict] = [{} for _ in range(steps)]
    k, alive = 0, 0
    for name, (begin, end) in sorted(spans.items(), key=lambda kv: kv[1]):
        while k < len(memory) and memory[k][0] < begin:
            alive += memory[k][1]
            k += 1
        peak = alive
        while k < len(memory) and memory[k][0] <= end:
            alive += memory[k][1]
            peak = max(peak, alive)
            k += 1
        step, phase = name[len("kiln_step") :].split(".")
        out[int(step)][phase] = (peak, alive)
    return out


def _ddp_rank(rank: int, compiler: str, steps: int, layers: int, port: str, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        row = run(compiler, steps, layers, rank)
        if rank == 0:
            queue.put(row)
    finally:
        torch.distributed.destroy_process_group()


def _one(compiler: str, steps: int, layers: int, ddp: bool) -> dict:
    if not ddp:
        return run(compiler, steps, layers)
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.spawn(_ddp_rank, args=(compiler, steps, layers, port, queue), nprocs=2)
    return queue.get(timeout=60)


def _table(rows: list[dict]) -> None:
    eager = next((r["losses"] for r in rows if r["compiler"] == "eager"), None)
    head = " | ".join(f"{p} peak | {p} end" for p in PHASES)
    print(f"| compiler | step | {head} | step peak | loss diff |")
    print("| --- | --- | " + " | ".join("---" for _ in range(2 * len(PHASES))) + " | --- | --- |")
    for r in rows:
        diff = "-"
        if eager is not None:
            diff = f"{max(abs(a - b) for a, b in zip(r['losses'], eager)):.1e}"
        for i in (0, len(r["steps"]) - 1):
            phases = r["steps"][i]
            cells = [f"{v / MIB:.1f}" for p in PHASES for v in phases[p]]
            peak = max(phases[p][0] for p in PHASES) / MIB
            cells += [f"{peak:.1f}", diff]
            print(f"| {r['compiler']} | {i + 1} | " + " | ".join(cells) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compilers", default="eager,torch,kiln")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--ddp", action="store_true", help="DDP over 2 gloo processes")
    ap.add_argument("--json", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.steps, args.layers, args.ddp)))
        return 0
    rows = []
    for compiler in args.compilers.split(","):
        cmd = [sys.executable, __file__, "--one", compiler, "--steps", str(args.steps)]
        cmd += ["--layers", str(args.layers)] + (["--ddp"] if args.ddp else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode or not lines:
            print(f"{compiler}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(lines[-1]))
    print(f"CPU, GPT-2 {args.layers} layers d128 2x128{', DDP 2 gloo ranks' if args.ddp else ''}")
    print("MiB alive above the model and batches, since the first step began")
    _table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
