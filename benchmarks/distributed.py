"""GPT-2-small data-parallel training under torchrun: eager, torch.compile or kiln, with DDP or
FSDP2; one compiler and one wrapping per process invocation (each compiler gets a fresh process).

    torchrun --standalone --nproc_per_node N benchmarks/distributed.py \\
        --compiler {eager,torch,kiln} --wrap {ddp,fsdp} --out result.json [--tiny]

The model is transformers' GPT2LMHeadModel built from GPT2Config() with random weights when
transformers is installed, else the self-contained GPT-2 below (same shapes). Each rank trains
on its own random tokens (seeded by rank; the same for every compiler, so loss curves compare),
batch 8 x 1024 per GPU, bf16 autocast, AdamW, 20 steps. DDP: `compiler(DDP(model))`. FSDP2 (the
torchtitan recipe): every block compiled, then `fully_shard`ed, then the root `fully_shard`ed.

Rank 0 writes JSON to --out: the loss curve (mean over ranks), step time (median of the steps
after --warmup), tokens/s per GPU, peak memory per GPU, and the fraction of gradient
communication (all-reduce / reduce-scatter kernel time) that overlaps compute kernels on the
GPU, from a torch.profiler trace of --profile-steps extra steps; on CPU (gloo) memory and
overlap are "n/a". `--tiny` shrinks everything for a CPU smoke test.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

GiB = 1024**3


# ---- the model ---------------------------------------------------------------------------------
class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class _GPT2(nn.Module):
    """GPT-2 without transformers: token and position embeddings, blocks, tied head."""

    def __init__(self, vocab: int, positions: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(positions, d)
        self.h = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


class _HFLogits(nn.Module):
    """transformers' GPT2LMHeadModel giving logits (the loss is computed outside, the same way
    for both models)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx):
        return self.model(input_ids=idx, use_cache=False).logits


def build_model(tiny: bool):
    size = dict(vocab=50257, positions=1024, d=768, layers=12, heads=12)
    if tiny:
        size = dict(vocab=512, positions=64, d=64, layers=2, heads=2)
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return _GPT2(**size), "self-contained GPT-2", lambda m: m.h
    config = GPT2Config(
        vocab_size=size["vocab"],
        n_positions=size["positions"],
        n_embd=size["d"],
        n_layer=size["layers"],
        n_head=size["heads"],
        use_cache=False,
    )
    config._attn_implementation = "sdpa"
    model = _HFLogits(GPT2LMHeadModel(config))
    return model, "transformers GPT2LMHeadModel", lambda m: m.model.transformer.h


# ---- communication overlap from a profiler trace -----------------------------------------------
# gradient communication (DDP: all-reduce; FSDP2: reduce-scatter) and FSDP2's parameter
# all-gather, by NCCL kernel name (ncclDevKernel_AllReduce_Sum_f32_RING_LL, ...)
COMM_KINDS = {
    "allreduce": ("allreduce",),
    "reducescatter": ("reducescatter",),
    "allgather": ("allgather",),
}


def _union(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _covered(interval, union) -> float:
    s, e = interval
    return sum(max(0.0, min(e, ue) - max(s, us)) for us, ue in union)


def overlap_fraction(kernels) -> dict:
    """`kernels`: (name, start_us, end_us) of GPU kernels. Per kind of gradient communication:
    the fraction of its kernel time during which some compute kernel ran too."""
    compute = _union([(s, e) for name, s, e in kernels if "nccl" not in name.lower() and e > s])
    out = {}
    for kind, keys in COMM_KINDS.items():
        comm = [
            (s, e)
            for name, s, e in kernels
            if "nccl" in name.lower() and any(k in name.lower().replace("_", "") for k in keys)
        ]
        total = sum(e - s for s, e in comm)
        out[kind] = {
            "kernels": len(comm),
            "comm_ms": round(total / 1e3, 3),
            "overlapped": round(sum(_covered(c, compute) for c in comm) / total, 4)
            if total > 0
            else None,
        }
    return out


def _gpu_kernels(prof):
    kernels = []
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            kernels.append((evt.name, evt.time_range.start, evt.time_range.end))
    return kernels


# ---- the run -----------------------------------------------------------------------------------
def wrap(model, args, blocks_of, device):
    """`model` wrapped for data parallelism and compiled as --compiler says."""
    if args.compiler == "kiln":
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
        import kiln

        opts = {"optimize_ddp": False} if args.no_optimize_ddp else None
        compile_fn = functools.partial(kiln.compile, options=opts)
    elif args.compiler == "torch":
        compile_fn = torch.compile
    else:
        compile_fn = None
    if args.wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        return compile_fn(ddp) if compile_fn else ddp
    from torch.distributed.fsdp import fully_shard

    blocks = blocks_of(model)
    for i in range(len(blocks)):
        block = compile_fn(blocks[i]) if compile_fn else blocks[i]
        fully_shard(block)
        blocks[i] = block
    fully_shard(model)
    return model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compiler", choices=("eager", "torch", "kiln"), required=True)
    p.add_argument("--wrap", choices=("ddp", "fsdp"), required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=None, help="per GPU (default 8; tiny: 2)")
    p.add_argument("--seq", type=int, default=None, help="tokens (default 1024; tiny: 64)")
    p.add_argument("--tiny", action="store_true", help="a small model, for a CPU smoke test")
    p.add_argument("--trace-dir", default=None, help="save each rank's profiler trace here")
    p.add_argument(
        "--no-optimize-ddp",
        action="store_true",
        help="kiln: one graph, not split at DDP's bucket boundaries (options optimize_ddp=False)",
    )
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    batch = args.batch or (2 if args.tiny else 8)
    seq = args.seq or (64 if args.tiny else 1024)

    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))

    torch.manual_seed(0)  # the same initial weights on every rank and for every compiler
    model, model_name, blocks_of = build_model(args.tiny)
    model.to(device)
    vocab = 512 if args.tiny else 50257
    g = torch.Generator().manual_seed(1234 + rank)
    data = [
        torch.randint(0, vocab, (batch, seq + 1), generator=g)
        for _ in range(args.steps + args.profile_steps)
    ]
    train_model = wrap(model, args, blocks_of, device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def step(tokens):
        tokens = tokens.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = train_model(tokens[:, :-1])
        loss = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
        )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    losses, times, issue = [], [], []
    counts_after_first = None
    for i in range(args.steps):
        sync()
        t0 = time.perf_counter()
        losses.append(step(data[i]))
        issue.append(time.perf_counter() - t0)  # the CPU's part: until step() returned
        sync()
        times.append(time.perf_counter() - t0)
        if i == 0 and args.compiler == "kiln":
            counts_after_first = _kiln_counts(train_model, model, blocks_of, args.wrap)
    syncs = _sync_points(step, data[args.steps - 1]) if cuda else "n/a"
    overlap: dict | str = "n/a"
    if cuda and args.profile_steps > 0:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(args.profile_steps):
                step(data[args.steps + i])
            sync()
        overlap = overlap_fraction(_gpu_kernels(prof))
        if args.trace_dir:
            os.makedirs(args.trace_dir, exist_ok=True)
            prof.export_chrome_trace(
                os.path.join(args.trace_dir, f"{args.compiler}_{args.wrap}_rank{rank}.json")
            )
    curve = torch.stack(losses).float()
    dist.all_reduce(curve)  # (gloo and NCCL both sum; the mean over ranks below)
    curve = (curve / world).tolist()
    peak = torch.cuda.max_memory_allocated(device) / GiB if cuda else None
    per_rank = [None] * world
    dist.all_gather_object(per_rank, {"peak_gib": peak, "overlap": overlap})
    timed = times[args.warmup :] or times
    step_s = statistics.median(timed)
    result = {
        "compiler": args.compiler,
        "wrap": args.wrap,
        "world_size": world,
        "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
        "backend": dist.get_backend(),
        "model": model_name + (" (tiny)" if args.tiny else ""),
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),  # (global)
        "batch_per_gpu": batch,
        "seq": seq,
        "steps": args.steps,
        "losses": curve,
        "step_ms_median": round(step_s * 1e3, 3),
        "step_ms": [round(t * 1e3, 3) for t in times],
        # median over the timed steps of the time until step() returned, before the sync: close
        # to step_ms_median means the CPU (Python, hooks, launches) is what the step waits for
        "cpu_issue_ms_median": round(statistics.median(issue[args.warmup :] or issue) * 1e3, 3),
        # CPU-GPU synchronisations of one step (torch.cuda.set_sync_debug_mode), by source line
        "sync_points": syncs,
        "first_step_s": round(times[0], 3),
        "tokens_per_s_per_gpu": round(batch * seq / step_s, 1),
        "peak_mem_gib_per_gpu": [
            round(r["peak_gib"], 3) if r["peak_gib"] is not None else "n/a" for r in per_rank
        ],
        "comm_overlap_per_gpu": [r["overlap"] for r in per_rank],
        "torch": torch.__version__,
    }
    if args.compiler == "kiln":
        result["kiln"] = _kiln_summary(train_model, model, blocks_of, args.wrap)
        result["kiln"]["optimize_ddp"] = not args.no_optimize_ddp
        after = _kiln_counts(train_model, model, blocks_of, args.wrap)
        # what kiln did after the first step: captures (recompiles) and fallbacks should be 0
        result["kiln"]["after_first_step"] = {
            k: after[k] - counts_after_first[k] for k in ("captures", "fallbacks")
        }
        result["kiln"]["fallback_reasons"] = after["fallback_reasons"]
    if rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps({k: v for k, v in result.items() if k not in ("step_ms",)}, indent=1))
    dist.destroy_process_group()
    ok = all(math.isfinite(x) for x in curve)
    return 0 if ok else 1


def _sync_points(step, tokens) -> dict:
    """One more step under torch.cuda.set_sync_debug_mode("warn"): every operation that makes
    the CPU wait for the GPU warns; counted by the source line that called it."""
    import collections
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(tokens)
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    where = collections.Counter(
        f"{os.path.relpath(w.filename)}:{w.lineno}"
        for w in caught
        if "synchroniz" in str(w.message).lower()
    )
    return dict(where.most_common())


def _compiled_units(train_model, model, blocks_of, wrap_kind) -> list:
    if wrap_kind == "ddp":
        roots = [train_model._kiln_compiled]
    else:
        roots = [b._kiln_compiled for b in blocks_of(model) if hasattr(b, "_kiln_compiled")]
    units = []
    for cf in roots:
        for c in (cf, *cf.nested):
            units += [c, *c.continuations.values()]
    return units


def _kiln_counts(train_model, model, blocks_of, wrap_kind) -> dict:
    """Captures (first compiles and recompiles) of every compiled unit, and fallbacks so far."""
    from kiln.backends.builtin import fallbacks

    units = _compiled_units(train_model, model, blocks_of, wrap_kind)
    return {
        "captures": sum(u.compiles for u in units),
        "fallbacks": len(fallbacks()),
        "fallback_reasons": sorted({str(f).splitlines()[0] for f in fallbacks()}),
    }


def _kiln_summary(train_model, model, blocks_of, wrap_kind) -> dict:
    """What kiln compiled: graphs, graph breaks and frames it ran eagerly."""
    from kiln.capture.explain import report

    if wrap_kind == "ddp":
        compiled = [train_model._kiln_compiled]
    else:
        compiled = [b._kiln_compiled for b in blocks_of(model) if hasattr(b, "_kiln_compiled")]
    reports = [report(cf) for cf in compiled]
    return {
        "graphs": sum(r.graph_count for r in reports),
        "graph_breaks": sorted({b[0].splitlines()[0] for r in reports for b in r.breaks}),
        "runs_eagerly": sorted({e.splitlines()[0] for r in reports for e in r.eager_reasons}),
        "splits": sorted({s for r in reports for s in r.splits}),
    }


if __name__ == "__main__":
    sys.exit(main())
