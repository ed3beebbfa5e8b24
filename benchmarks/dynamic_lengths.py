"""Issue 31's CPU acceptance: a transformer block called with 60 different sequence lengths.

Counts how many graphs kiln compiled and how many `.so` files it built over the 60 lengths,
checks every call against eager, and compares the steady time per length with a kiln entry
compiled for that length alone (geomean of dynamic / static over the lengths measured both
ways, timed call by call alternately, medians).

Two levels:
  --level compile   `kiln.compile(block)` called with each length (capture, AOT autograd and the
                    code generator; needs AOT autograd that traces symbolic sizes), against
                    `kiln.compile(block, dynamic=False)` per length;
  --level graph     the code generator alone: the block's ATen graph traced once with a
                    symbolic length and compiled once by `compile_graph`, against the graph
                    traced and compiled at each length.

Usage: PYTHONPATH=src python benchmarks/dynamic_lengths.py [--level compile|graph]
           [--static-every 5] [--calls 20] [--json out.json]
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


def _steady_pair(dyn, static, x, calls: int) -> tuple[float, float]:
    """Median seconds a call of `dyn` and of `static`, timed alternately call by call: the
    machine's load (other processes come and go) then falls on both alike."""
    for _ in range(3):
        dyn(x)
        static(x)
    d_times, s_times = [], []
    for _ in range(calls):
        for fn, times in ((dyn, d_times), (static, s_times)):
            start = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - start)
    return statistics.median(d_times), statistics.median(s_times)


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
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    import kiln

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
        rows = []
        for t in LENGTHS[:: args.static_every]:
            g0, b0 = counter.snapshot()
            if args.level == "compile":
                kiln.reset()  # an entry for this length alone, in a fresh cache of entries
                static = kiln.compile(Block().eval(), dynamic=False)
                static.load_state_dict(block.state_dict())
            else:
                static = compiled_for(inputs[t], dynamic=False)
            torch.testing.assert_close(static(inputs[t]), block(inputs[t]), rtol=1e-4, atol=1e-4)
            if args.level == "compile":
                kiln.reset()
                dyn = kiln.compile(block)  # the dynamic entry again, after the reset
                for u in LENGTHS[:2]:
                    dyn(inputs[u])
            d_s, s_s = _steady_pair(dyn, static, inputs[t], args.calls)
            d_ms, s_ms = d_s * 1e3, s_s * 1e3
            rows.append({"length": t, "dynamic_ms": d_ms, "static_ms": s_ms, "ratio": d_ms / s_ms})
            print(f"T={t:4d}  dynamic {d_ms:8.3f} ms  static {s_ms:8.3f} ms  x{d_ms / s_ms:.3f}")
    geo = math.exp(statistics.fmean(math.log(r["ratio"]) for r in rows))
    result = {
        "level": args.level,
        "lengths": len(LENGTHS),
        "graphs_compiled": graphs,
        "so_builds": builds,
        "first_pass_s": first_pass,
        "max_abs_error": worst,
        "geomean_dynamic_over_static": geo,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }
    print(
        f"{args.level}: {len(LENGTHS)} lengths, {graphs} graphs compiled, {builds} .so builds, "
        f"first pass {first_pass:.1f} s, every call matches eager (max abs err {worst:.2e}); "
        f"steady dynamic/static geomean x{geo:.3f} over {len(rows)} lengths"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
