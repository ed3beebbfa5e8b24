"""What the min-cut partition buys: a nanoGPT-style training step on CPU, eager vs kiln.

Takes command-line options (model size, steps); prints a Markdown table (and, with --json, a
JSON file) comparing, for one training step (forward, backward, SGD update) with dropout on:

- eager PyTorch,
- kiln `aot_eager` with the min-cut partition (recompute cheap ops in the backward),
- kiln `aot_eager` saving every value the backward reads (`partition="save_all"`),

(each with and without kiln's decomposition table, the graphs the code generator receives) on:
tensors saved for backward (count and bytes of distinct storages, all and activations only,
measured with `torch.autograd.graph.saved_tensors_hooks` during a real forward); the peak
memory of one step above the memory held before it (Linux peak RSS, reset through
/proc/self/clear_refs just before the step; glibc's mmap threshold is fixed at 128 KiB so that
freed tensors leave RSS at once); kiln's compile time; and the median step time. Memory and
compile time are measured with each configuration in its own fresh process, `--rounds` times,
keeping the best round; step times in one more process where the configurations take turns
step by step, so that load from other processes on a shared machine falls on all alike.

The graph is the model traced with `torch.fx` into its submodules, parameters and buffers lifted
to inputs (the shape kiln's capture hands to a backend), so the benchmark measures the autograd
stage alone. Run: `python benchmarks/aot_partition.py` (add `--help` for the options).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

os.environ.setdefault("KILN_ARTIFACT_CACHE", "0")  # it reads AOT partitions: compile, never load

# config -> (decompositions: kiln's table or none, partition strategy)
CONFIGS = {
    "eager": None,
    "kiln aot_eager (min-cut)": ({}, "min_cut"),
    "kiln aot_eager (save-all)": ({}, "save_all"),
    "kiln aot_eager + decomps (min-cut)": (None, "min_cut"),
    "kiln aot_eager + decomps (save-all)": (None, "save_all"),
}


class Block(nn.Module):
    def __init__(self, d, n_head, block_size, p):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.attn_drop, self.resid_drop = nn.Dropout(p), nn.Dropout(p)
        self.n_head, self.d, self.T = n_head, d, block_size
        mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("bias", mask)

    def forward(self, x):
        T, C, H = self.T, self.d, self.n_head
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(-1, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
        att = att.masked_fill(self.bias == 0, float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(-1, T, C)
        x = x + self.resid_drop(self.proj(y))
        return x + self.resid_drop(self.fc_out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab, d, n_head, n_layer, block_size, p=0.1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block_size, d)
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(Block(d, n_head, block_size, p) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.block_size, self.vocab = block_size, vocab

    def forward(self, idx, targets):
        pos = torch.arange(0, self.block_size, dtype=torch.long, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return (F.cross_entropy(logits.view(-1, self.vocab), targets.view(-1)),)


class _IntoModules(torch.fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return False


def lift(module: nn.Module, n_inputs: int):
    """The module as capture would give it: params, buffers and constants lifted to inputs."""
    graph = _IntoModules().trace(module)
    last = [n for n in graph.nodes if n.op == "placeholder"][n_inputs - 1]
    lifted, tensors = {}, []
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        if node.target not in lifted:
            with graph.inserting_after(last):
                last = lifted[node.target] = graph.placeholder(node.target.replace(".", "_"))
            tensors.append(functools.reduce(getattr, node.target.split("."), module))
        node.replace_all_uses_with(lifted[node.target])
        graph.erase_node(node)
    return torch.fx.GraphModule(module, graph), tensors


def saved_tensor_stats(step_forward, param_ptrs: set[int]) -> dict:
    """Count and bytes of distinct storages saved for backward during one forward."""
    storages: dict[int, tuple[int, bool]] = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = (s.nbytes(), s.data_ptr() in param_ptrs)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step_forward()
    acts = [b for b, is_param in storages.values() if not is_param]
    return {
        "saved_count": len(storages),
        "saved_mb": sum(b for b, _ in storages.values()) / 2**20,
        "saved_act_count": len(acts),
        "saved_act_mb": sum(acts) / 2**20,
        "loss": loss,
    }


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def step_peak_mb(step) -> float:
    """Peak RSS during `step()` above RSS before it (Linux only)."""
    gc.collect()
    base = _status_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak (VmHWM) to the current RSS
    step()
    return _status_mb("VmHWM") - base


def setup(args):
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = GPT(args.vocab, args.d, args.heads, args.layers, args.block).train(True)
    gm, state = lift(model, 2)
    shape = (args.batch, args.block)
    batches = [
        (torch.randint(0, args.vocab, shape), torch.randint(0, args.vocab, shape)) for _ in range(4)
    ]
    return gm, state, batches


def make_step(fn, state, batches):
    opt = torch.optim.SGD([p for p in state if p.requires_grad], lr=1e-3)

    def step(i):
        idx, targets = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = fn(idx, targets, *state)[0]
        loss.backward()
        opt.step()
        return loss

    return step


def compile_config(config: str, gm, example_inputs):
    from kiln.autograd import aot_compile
    from kiln.autograd.backend import eager_graph

    decompositions, partition = CONFIGS[config]
    return aot_compile(
        gm,
        example_inputs,
        fw_compiler=eager_graph,
        bw_compiler=eager_graph,
        decompositions=decompositions,
        partition=partition,
    )


def interleaved_step_ms(args) -> dict[str, float]:
    """Median step time per config, all configs in one process taking turns step by step,
    so that load from other processes on a shared machine falls on all of them alike."""
    gm, state, batches = setup(args)
    steps = {}
    for config in CONFIGS:
        fn = gm if CONFIGS[config] is None else compile_config(config, gm, [*batches[0], *state])
        steps[config] = make_step(fn, state, batches)
        for i in range(args.warmup):
            steps[config](i)
    times: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for i in range(args.steps):
        for config, step in steps.items():
            t0 = time.perf_counter()
            step(i)
            times[config].append(time.perf_counter() - t0)
    return {c: statistics.median(t) * 1e3 for c, t in times.items()}


def run_one(config: str, args) -> dict:
    gm, state, batches = setup(args)
    param_ptrs = {p.untyped_storage().data_ptr() for p in state}
    result = {"config": config}
    fn = gm
    if CONFIGS[config] is not None:
        t0 = time.perf_counter()
        fn = compile_config(config, gm, [*batches[0], *state])
        result["compile_s"] = time.perf_counter() - t0
        part = next(iter(fn.partitions.values()))
        result["graph_saved_count"] = len(part.saved)
        result["graph_saved_mb"] = part.saved_bytes / 2**20
        result["recomputed_ops"] = len(part.recomputed)

    step = make_step(fn, state, batches)
    for i in range(args.warmup):
        step(i)
    result["peak_step_mb"] = min(step_peak_mb(lambda: step(0)) for _ in range(3))
    stats = saved_tensor_stats(lambda: fn(*batches[0], *state)[0], param_ptrs)
    stats.pop("loss")
    result.update(stats)
    return result


def table(rows: list[dict]) -> str:
    cols = [
        ("config", "config", "{}"),
        ("saved_count", "saved tensors", "{}"),
        ("saved_mb", "saved MiB", "{:.2f}"),
        ("saved_act_count", "saved activations", "{}"),
        ("saved_act_mb", "activation MiB", "{:.2f}"),
        ("peak_step_mb", "step peak MiB", "{:.1f}"),
        ("step_ms", "step ms (median)", "{:.1f}"),
        ("compile_s", "compile s", "{:.2f}"),
        ("recomputed_ops", "ops recomputed in bw", "{}"),
    ]
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [fmt.format(r[k]) if k in r else "-" for k, _, fmt in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="also write the rows to this JSON file")
    one = [*CONFIGS, "times"]
    p.add_argument("--one", choices=one, help=argparse.SUPPRESS)  # a child process
    args = p.parse_args(argv)
    if args.one == "times":
        print(json.dumps(interleaved_step_ms(args)))
        return
    if args.one:
        print(json.dumps(run_one(args.one, args)))
        return
    child_args = list(argv if argv is not None else sys.argv[1:])
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(128 * 1024))

    def child(what: str) -> dict:
        out = subprocess.run(
            [sys.executable, __file__, *child_args, "--one", what],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        ).stdout
        return json.loads(out.strip().splitlines()[-1])

    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for config in CONFIGS:
            row = child(config)
            prev = best.setdefault(config, row)
            for key in ("peak_step_mb", "compile_s"):
                if key in row:
                    prev[key] = min(prev[key], row[key])
    for config, ms in child("times").items():
        best[config]["step_ms"] = ms
    rows = list(best.values())
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
