"""Capture benchmarks (issue 2): how long kiln's capture takes and what a compiled call costs.

1. Capture time of a 12-layer GPT-2-style forward (d=768, 12 heads, batch 1 x 64 tokens): the
   first call of `kiln.compile(model, backend="eager")` (trace + guards + residual; the trace
   runs the real forward once), against the first call of `torch.compile(model,
   backend="eager")` (Dynamo's capture, torch._dynamo already imported). Each in a fresh process.
   A full garbage collection is run just before either first call: building the model and
   importing torch, kiln or Dynamo leave one pending (55-68 ms here), and without the collect it
   lands inside whichever first call crosses the allocation threshold, which measures the
   program's garbage, not the compiler (`--pending-gc` times it the old way).
2. Per-call overhead of a compiled function with 10 tensor inputs: median time of a compiled
   call minus a direct call of the captured graph's callable, over many calls.
3. Per-call cost of a large module's entry function (guards, input fetch, result rebuild): a
   ResNet-style CNN with 50 conv+BN pairs (157 modules, 308 parameters and buffers, about as
   many as torchvision's ResNet-50 has), compiled with backend="eager"; the entry is timed
   with its graph call replaced by one returning the recorded outputs, so what is left is
   kiln's own per-call work.

Usage: python benchmarks/capture_overhead.py [--reps N] [--only capture|overhead|guards]
       [--pending-gc]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import timeit

GPT_SRC = r"""
import gc, math, time, torch, torch.nn as nn, torch.nn.functional as F
class Attn(nn.Module):
    def __init__(s, d, h):
        super().__init__(); s.h = h; s.qkv = nn.Linear(d, 3 * d); s.proj = nn.Linear(d, d)
    def forward(s, x):
        b, t, d = x.shape
        q, k, v = s.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, s.h, d // s.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return s.proj(y.transpose(1, 2).contiguous().view(b, t, d))
class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__(); s.ln1 = nn.LayerNorm(d); s.ln2 = nn.LayerNorm(d)
        s.attn = Attn(d, h); s.fc = nn.Linear(d, 4 * d); s.out = nn.Linear(4 * d, d)
        s.drop = nn.Dropout(0.0)
    def forward(s, x):
        x = x + s.drop(s.attn(s.ln1(x)))
        return x + s.drop(s.out(F.gelu(s.fc(s.ln2(x)), approximate="tanh")))
class GPT(nn.Module):
    def __init__(s, vocab=50257, d=768, h=12, n=12, t=1024):
        super().__init__(); s.wte = nn.Embedding(vocab, d); s.wpe = nn.Embedding(t, d)
        s.blocks = nn.ModuleList([Block(d, h) for _ in range(n)]); s.ln_f = nn.LayerNorm(d)
        s.head = nn.Linear(d, vocab, bias=False)
    def forward(s, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = s.wte(idx) + s.wpe(pos)
        for blk in s.blocks:
            x = blk(x)
        return s.head(s.ln_f(x))
torch.manual_seed(0)
model = GPT().eval()
idx = torch.randint(0, 50257, (1, 64))
with torch.no_grad():
    t0 = time.perf_counter(); ref = model(idx); eager_s = time.perf_counter() - t0
    if WHICH == "kiln":
        import kiln
        cm = kiln.compile(model, backend="eager")
    else:
        import torch._dynamo
        cm = torch.compile(model, backend="eager")
    if COLLECT:
        gc.collect()
    t0 = time.perf_counter(); out = cm(idx); first = time.perf_counter() - t0
    idx2 = torch.randint(0, 50257, (1, 64))
    ok = torch.allclose(cm(idx2), model(idx2), atol=1e-5)
print(json.dumps({"first_call_s": first, "eager_forward_s": eager_s, "correct": ok}))
"""


def capture_time(which: str, collect: bool = True) -> dict:
    src = f"import json\nWHICH = {which!r}\nCOLLECT = {collect!r}\n" + GPT_SRC
    out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def call_overhead(reps: int) -> dict:
    import torch

    import kiln

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(a, b, c, d, e, f_, g, h, i, j):
        return a + b + c + d + e + f_ + g + h + i + j

    xs = [torch.randn(4) for _ in range(10)]
    cf = kiln.compile(f, backend=backend)
    cf(*xs)
    cf(*xs)
    direct = graphs[0].forward
    number = 20000
    t_comp = min(timeit.repeat(lambda: cf(*xs), number=number, repeat=reps)) / number
    t_direct = min(timeit.repeat(lambda: direct(*xs), number=number, repeat=reps)) / number
    return {
        "compiled_us": t_comp * 1e6,
        "direct_graph_us": t_direct * 1e6,
        "overhead_us": (t_comp - t_direct) * 1e6,
    }


CNN_SRC = r"""
import torch, torch.nn as nn
class BasicBlock(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False); s.bn1 = nn.BatchNorm2d(c)
        s.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False); s.bn2 = nn.BatchNorm2d(c)
        s.relu = nn.ReLU(inplace=True)
    def forward(s, x):
        out = s.relu(s.bn1(s.conv1(x)))
        return s.relu(s.bn2(s.conv2(out)) + x)
class Net(nn.Module):
    def __init__(s, blocks=25, c=8):
        super().__init__()
        s.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                               nn.ReLU(inplace=True))
        s.layers = nn.Sequential(*[BasicBlock(c) for _ in range(blocks)])
        s.fc = nn.Linear(c, 10)
    def forward(s, x):
        return s.fc(torch.flatten(s.layers(s.stem(x)).mean((2, 3)), 1))
"""


def guard_cost(reps: int) -> dict:
    import torch

    import kiln

    scope: dict = {}
    exec(CNN_SRC, scope)
    torch.manual_seed(0)
    model = scope["Net"]().eval()
    x = torch.randn(1, 3, 8, 8)
    cm = kiln.compile(model, backend="eager")
    with torch.no_grad():
        cm(x)
        cm(x)  # the graph's code is generated on the first call after the trace
        compiled = cm.__dict__["_kiln_compiled"]
        entry = compiled.entries[0]
        g = entry.__globals__
        real, outs = g["___graph"], []
        g["___graph"] = lambda *a: outs.append(real(*a)) or outs[-1]
        ok = torch.allclose(entry(x), model(x))
        g["___graph"] = lambda *a: outs[0]
        number = 200  # short runs, many of them: the fastest is the one least disturbed
        t = min(timeit.repeat(lambda: entry(x), number=number, repeat=reps * 20)) / number
        g["___graph"] = real
    n_tensors = sum(1 for _ in model.parameters()) + sum(1 for _ in model.buffers())
    return {
        "entry_us": t * 1e6,
        "modules": sum(1 for _ in model.modules()),
        "tensors": n_tensors,
        "correct": ok,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", choices=("capture", "overhead", "guards"))
    ap.add_argument("--pending-gc", action="store_true", help="no gc.collect() before first calls")
    args = ap.parse_args()
    import torch

    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}")
    if args.only == "guards":
        g = guard_cost(args.reps)
        print(
            f"ResNet-style CNN ({g['modules']} modules, {g['tensors']} parameters and "
            f"buffers): entry function without its graph call {g['entry_us']:.1f} us "
            f"correct={g['correct']}"
        )
        return
    kiln_t = capture_time("kiln", not args.pending_gc)
    torch_t = capture_time("torch", not args.pending_gc)
    if args.only == "capture":
        print(
            f"  kiln {kiln_t['first_call_s']:.3f} s, "
            f"torch.compile {torch_t['first_call_s']:.3f} s, "
            f"ratio {kiln_t['first_call_s'] / torch_t['first_call_s']:.3f}"
        )
        return
    overhead = call_overhead(args.reps)
    guards = guard_cost(args.reps)
    print(
        f"GPT-2-style 12-layer forward (1x64 tokens), eager forward "
        f"{kiln_t['eager_forward_s'] * 1e3:.0f} ms"
    )
    print(
        f"  kiln capture (first call, backend=eager):   {kiln_t['first_call_s']:.3f} s "
        f"correct={kiln_t['correct']}"
    )
    print(
        f"  torch.compile Dynamo (first call, eager):   {torch_t['first_call_s']:.3f} s "
        f"correct={torch_t['correct']}"
    )
    print(f"  ratio kiln / torch.compile: {kiln_t['first_call_s'] / torch_t['first_call_s']:.3f}")
    print(
        f"10-input function: compiled call {overhead['compiled_us']:.2f} us, direct graph "
        f"call {overhead['direct_graph_us']:.2f} us, overhead {overhead['overhead_us']:.2f} us"
    )
    print(
        f"ResNet-style CNN ({guards['modules']} modules, {guards['tensors']} parameters and "
        f"buffers): entry function without its graph call {guards['entry_us']:.1f} us"
    )
    print(
        json.dumps(
            {
                "kiln": kiln_t,
                "torch": torch_t,
                "overhead": overhead,
                "guards": guards,
                "date": time.strftime("%Y-%m-%d"),
            }
        )
    )


if __name__ == "__main__":
    main()
