"""Issue 31's training item: nanoGPT trained with a new sequence length on every step.

One `kiln.compile(model)` (automatic dynamic shapes: the first length compiles static, the
second makes the length symbolic) takes training steps (forward, cross-entropy loss, backward)
at lengths drawn from 64..256 with a fixed seed. Every step's loss and every parameter's
gradient are compared with eager on a copy of the model; the script counts kiln's compiles
(captured graphs), the graphs given to the code generator and the C++ builds. Then the steady
step time per length against a kiln entry compiled for that length alone (`dynamic=False`),
interleaved A/B in one process (rounds visit every length, the order of the two alternates by
round; medians over all rounds, and the best step of each), and the geomeans of dynamic /
static.

    PYTHONPATH=src python3 benchmarks/dynamic_training.py [--steps 8] [--seed 0]
        [--layers 2] [--embd 128] [--rounds 6] [--calls 3] [--threads N] [--json out.json]

Builds go to a fresh cache directory, so every build counted was compiled by this run.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time

os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-dyntrain-"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

VOCAB, BATCH = 256, 2


def _gpt(layers: int, embd: int):
    from kiln.bench import suite

    suite.load_models(suite.models_dir())
    nanogpt = sys.modules["kiln_benchmark_models.nanogpt"]
    cfg = nanogpt.GPTConfig(block_size=256, vocab_size=VOCAB, n_layer=layers, n_head=4, n_embd=embd)
    return nanogpt.GPT(cfg).train()


def _batch(t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (BATCH, t), generator=g), torch.randint(
        0, VOCAB, (BATCH, t), generator=g
    )


def _step(fn, model, idx, targets) -> torch.Tensor:
    """Forward, loss and backward; gradients set to None first (what an optimizer loop does)."""
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(fn(idx).reshape(-1, VOCAB), targets.reshape(-1))
    loss.backward()
    return loss


def _timed(fn, model, batch, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        _step(fn, model, *batch)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="lengths drawn from 64..256")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=3, help="steps timed per length and round")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--json")
    args = ap.parse_args()
    import kiln
    import kiln.codegen as codegen
    from kiln.backends import builtin
    from kiln.runtime import cpp_builder

    if args.threads:
        torch.set_num_threads(args.threads)
    graphs = []
    real = codegen.compile_graph

    def counted(*a, **kw):
        graphs.append(a[0])
        return real(*a, **kw)

    codegen.compile_graph = counted
    torch.manual_seed(args.seed)
    model = _gpt(args.layers, args.embd)
    ref = copy.deepcopy(model)
    lengths = random.Random(args.seed).sample(range(64, 257), args.steps)
    batches = {t: _batch(t, k) for k, t in enumerate(lengths)}
    dyn = kiln.compile(model)
    worst, start = 0.0, time.perf_counter()
    for t in lengths:  # the first pass: compiles happen here; every step checked against eager
        loss = _step(dyn, model, *batches[t])
        want = _step(ref, ref, *batches[t])
        torch.testing.assert_close(loss, want)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
            worst = max(worst, (p.grad - q.grad).abs().max().item())
    first_pass = time.perf_counter() - start
    compiles = dyn._kiln_compiled.compiles
    n_graphs, builds = len(graphs), cpp_builder.STATS["compiles"]
    fallbacks = [f"{f.graph}: {f.stage}" for f in builtin.fallbacks()]

    # a static entry per length, each its own compiled function over its own copy of the model
    statics = {}
    for t in lengths:
        m = copy.deepcopy(model)
        statics[t] = (kiln.compile(m, dynamic=False), m)
        for _ in range(2):
            _step(*statics[t], *batches[t])
            _step(dyn, model, *batches[t])
    d_times: dict = {t: [] for t in lengths}
    s_times: dict = {t: [] for t in lengths}
    for r in range(args.rounds):
        for t in lengths:
            pair = (((dyn, model), d_times), (statics[t], s_times))
            for (fn, m), times in pair if r % 2 == 0 else pair[::-1]:
                times[t] += _timed(fn, m, batches[t], args.calls)
    rows = []
    for t in lengths:
        d_ms, s_ms = statistics.median(d_times[t]) * 1e3, statistics.median(s_times[t]) * 1e3
        d_best, s_best = min(d_times[t]) * 1e3, min(s_times[t]) * 1e3
        rows.append(
            {
                "length": t,
                "dynamic_ms": d_ms,
                "static_ms": s_ms,
                "ratio": d_ms / s_ms,
                "best_ratio": d_best / s_best,
            }
        )
        print(
            f"T={t:4d}  dynamic {d_ms:8.3f} ms/step  static {s_ms:8.3f} ms/step  x{d_ms / s_ms:.3f}"
        )
    geo = math.exp(statistics.fmean(math.log(r["ratio"]) for r in rows))
    geo_best = math.exp(statistics.fmean(math.log(r["best_ratio"]) for r in rows))
    print(
        f"nanoGPT training, {len(lengths)} lengths {lengths}: {compiles} compiles, {n_graphs} "
        f"graphs to the code generator, {builds} C++ builds in the first pass, fallbacks "
        f"{fallbacks or 'none'}, first pass {first_pass:.1f} s, gradients match eager (max abs "
        f"diff {worst:.2e}); steady step dynamic/static geomean x{geo:.3f} (medians), "
        f"x{geo_best:.3f} (best steps), "
        f"{torch.get_num_threads()} threads"
    )
    if args.json:
        result = {
            "lengths": lengths,
            "compiles": compiles,
            "graphs_to_code_generator": n_graphs,
            "cpp_builds": builds,
            "fallbacks": fallbacks,
            "first_pass_s": first_pass,
            "max_abs_grad_diff": worst,
            "geomean_dynamic_over_static": geo,
            "geomean_best_dynamic_over_static": geo_best,
            "threads": torch.get_num_threads(),
            "rows": rows,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
