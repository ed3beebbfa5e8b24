"""Issue 31's CPU acceptance: a transformer block called with 60 different sequence lengths.

Counts how many graphs kiln compiled and how many `.so` files it built over the 60 lengths,
checks every call against eager, and compares the steady time per length with a kiln entry
compiled for that length alone (geomean of dynamic / static over the lengths measured both
ways: both warmed first, the dynamic entry on lengths that are not timed; then rounds that
visit every timed length and time the two entries alternately in one process, medians).

Two levels:
  --level compile   `kiln.compile(block)` called with each length (capture, AOT autograd and the
                    code generator; needs AOT autograd that traces symbolic sizes), against
                    `kiln.compile(block, dynamic=False)` per length;
  --level graph     the code generator alone: the block's ATen graph traced once with a
                    symbolic length and compiled once by `compile_graph`, against the graph
                    traced and compiled at each length.

Usage: PYTHONPATH=src python benchmarks/dynamic_lengths.py [--level compile|graph]
           [--static-every 5] [--calls 5] [--rounds 10] [--threads N] [--json out.json]
Builds go to a fresh cache directory, so every `.so` counted was compiled by this run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-dynlen-"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

LENGTHS = list(range(17, 257, 4))  # 60 lengths, odd ones, none a multiple of the vector width
WARM_LENGTHS = (13, 15)  # a fresh dynamic entry's first calls, before timing: never timed
BATCH, DIM, HEADS = 4, 256, 4


class Block(nn.Module):
    """A pre-LN GPT block with causal self-attention, written with plain ops."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc, self.out = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, -1)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // HEADS))
        i = torch.arange(t, device=x.device)
        att = att.masked_fill(i[None, :] > i[:, None], float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def _timed(fn, x, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return times


def _steady(dyn, statics: dict, inputs: dict, rounds: int, calls: int) -> dict:
    """{length: (seconds of each timed call of `dyn`, of its static entry)}. Interleaved
    A/B: every round visits every length and times `calls` calls of the dynamic entry and
    `calls` of the static one (which goes first alternates by round), so the load other
    processes put on the machine, which comes and goes, falls on both alike."""
    d_times: dict = {t: [] for t in statics}
    s_times: dict = {t: [] for t in statics}
    for r in range(rounds):
        for t, static in statics.items():
            pair = ((dyn, d_times), (static, s_times))
            for fn, times in pair if r % 2 == 0 else pair[::-1]:
                times[t] += _timed(fn, inputs[t], calls)
    return {t: (d_times[t], s_times[t]) for t in statics}


class Counter:
    """Counts graphs given to `compile_graph` and C++ builds (`.so` files compiled)."""

    def __init__(self) -> None:
        import kiln.codegen as codegen
        from kiln.runtime import cpp_builder

        self.stats = cpp_builder.STATS
        self.graphs = 0
        real = codegen.compile_graph

        def counted(*args, **kwargs):
            self.graphs += 1
            return real(*args, **kwargs)

        codegen.compile_graph = counted

    def snapshot(self) -> tuple[int, int]:
        return self.graphs, self.stats["compiles"]


def _graph_level(block: Block):
    """(dynamic callable, static-per-length factory) at the code generator's level."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    import kiln.codegen as codegen

    params = [p.detach() for p in block.parameters()]
    names = [n for n, _ in block.named_parameters()]

    def functional(x, *ps):
        return (torch.func.functional_call(block, dict(zip(names, ps)), (x,)),)

    def compiled_for(x, dynamic: bool):
        mode = FakeTensorMode(shape_env=ShapeEnv())

        def fake(t, dims=()):
            sizes = [DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(t.dim())]
            ctx = StatelessSymbolicContext(dynamic_sizes=sizes)
            return mode.from_tensor(t, symbolic_context=ctx)

        fx = fake(x, (1,) if dynamic else ())
        fps = [fake(p) for p in params]
        with mode:
            gm = make_fx(functional, tracing_mode="fake")(fx, *fps)
        out = codegen.compile_graph(gm, [x, *params])
        if isinstance(out, codegen.Declined):
            raise SystemExit(f"declined: {out.reason}")
        return lambda t: out(t, *params)[0]

    return compiled_for


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--level", choices=("compile", "graph"), default="compile")
    ap.add_argument("--static-every", type=int, default=5, help="static entry every Nth length")
    ap.add_argument("--calls", type=int, default=5, help="calls timed per length and round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--json")
    args = ap.parse_args()
    import kiln

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    block = Block().eval()
    counter = Counter()
    inputs = {t: torch.randn(BATCH, t, DIM) for t in LENGTHS}
    start = time.perf_counter()
    with torch.no_grad():
        if args.level == "compile":
            dyn = kiln.compile(block)
        else:
            compiled_for = _graph_level(block)
            dyn = compiled_for(inputs[LENGTHS[0]], dynamic=True)
        worst = 0.0
        for t in LENGTHS:  # every length once: compiles happen here
            got, want = dyn(inputs[t]), block(inputs[t])
            worst = max(worst, (got - want).abs().max().item())
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        first_pass = time.perf_counter() - start
        graphs, builds = counter.snapshot()
        # the static entries, each compiled for its length alone (a fresh compiled function)
        timed = LENGTHS[:: args.static_every]
        statics = {}
        for t in timed:
            if args.level == "compile":
                statics[t] = kiln.compile(block, dynamic=False)
            else:
                statics[t] = compiled_for(inputs[t], dynamic=False)
            want = block(inputs[t])
            torch.testing.assert_close(statics[t](inputs[t]), want, rtol=1e-4, atol=1e-4)
        if args.level == "compile":
            # a fresh dynamic entry, warmed on lengths that are not timed (its first call makes a
            # static entry for the first length, as automatic dynamic shapes do), then once at
            # every timed length (arenas sized, kernels loaded) before any timing
            dyn = kiln.compile(block)
            for u in WARM_LENGTHS:
                dyn(torch.randn(BATCH, u, DIM))
        for t in timed:
            for fn in (dyn, statics[t]):
                for _ in range(3):
                    fn(inputs[t])
        rows = []
        for t, (d_s, s_s) in _steady(dyn, statics, inputs, args.rounds, args.calls).items():
            # medians over all rounds; and the best call of each, which a machine loaded by
            # other processes disturbs least (a call is only ever slowed by them)
            d_ms, s_ms = statistics.median(d_s) * 1e3, statistics.median(s_s) * 1e3
            d_best, s_best = min(d_s) * 1e3, min(s_s) * 1e3
            rows.append(
                {
                    "length": t,
                    "dynamic_ms": d_ms,
                    "static_ms": s_ms,
                    "ratio": d_ms / s_ms,
                    "dynamic_best_ms": d_best,
                    "static_best_ms": s_best,
                    "best_ratio": d_best / s_best,
                }
            )
            print(
                f"T={t:4d}  median: dynamic {d_ms:8.3f} ms  static {s_ms:8.3f} ms  "
                f"x{d_ms / s_ms:.3f}   best: {d_best:8.3f} / {s_best:8.3f} ms  "
                f"x{d_best / s_best:.3f}"
            )
    geo = math.exp(statistics.fmean(math.log(r["ratio"]) for r in rows))
    geo_best = math.exp(statistics.fmean(math.log(r["best_ratio"]) for r in rows))
    result = {
        "level": args.level,
        "lengths": len(LENGTHS),
        "graphs_compiled": graphs,
        "so_builds": builds,
        "first_pass_s": first_pass,
        "max_abs_error": worst,
        "geomean_dynamic_over_static": geo,
        "geomean_best_dynamic_over_static": geo_best,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }
    print(
        f"{args.level}: {len(LENGTHS)} lengths, {graphs} graphs compiled, {builds} .so builds, "
        f"first pass {first_pass:.1f} s, every call matches eager (max abs err {worst:.2e}); "
        f"steady dynamic/static geomean x{geo:.3f} (medians), x{geo_best:.3f} (best calls) "
        f"over {len(rows)} lengths, {torch.get_num_threads()} threads"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
