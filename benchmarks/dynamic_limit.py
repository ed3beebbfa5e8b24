"""Past `cache_size_limit`: does a function kiln has given up on run at eager speed?

A small decoder (embedding, attention over a KV cache that grows by one position per call,
MLP, head) is called with a new cache length on every call, the way a decode loop calls its
forward. The attention scale `1 / math.sqrt(length)` pins the length (a Python float
kiln cannot record), so every length is a new entry and the limit (8 by default) is reached
after 8 calls; the calls after that are timed against eager on the same inputs. A
second model has a graph break in the middle (`--break`), so what gives up is a continuation
(the rest of the forward after the break), which is where the slow path hid (see
docs/dynamic_shapes.md, "Past the entry limit").

    PYTHONPATH=src python3 benchmarks/dynamic_limit.py [--break] [--backend eager] [--calls 200]

Prints one JSON line: per-call median time in microseconds for eager and for kiln past the
limit, their ratio, kiln's compiles and entries, and whether every result matched eager.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings

import torch
from torch import nn

import kiln


@kiln.disable
def _not_compiled() -> None:
    """A call kiln never compiles: a graph break where it is called."""


class Decoder(nn.Module):
    def __init__(self, dim: int = 64, layers: int = 4, vocab: int = 256, graph_break=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.q = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.o = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
            for _ in range(layers)
        )
        self.head = nn.Linear(dim, vocab)
        self.graph_break = graph_break

    def forward(self, token, cache):
        h = self.embed(token)  # (batch, 1, dim)
        if self.graph_break:  # the rest of the forward, which reads the cache, is a continuation
            _not_compiled()
        for q, o, mlp in zip(self.q, self.o, self.mlp):
            # math.sqrt of a length is a Python float: kiln guards the length's exact value
            # (it pins it), so every new length is a new entry, as in a decode loop that pins
            scores = q(h) @ cache.transpose(1, 2) / math.sqrt(cache.shape[1])
            att = torch.softmax(scores, dim=-1)
            h = h + o(att @ cache)
            h = h + mlp(h)
        return self.head(h)


def run(args) -> dict:
    torch.manual_seed(0)
    model = Decoder(graph_break=args.graph_break).eval()
    compiled = kiln.compile(model, backend=args.backend)
    batch, dim = 2, 64
    token = torch.randint(0, 256, (batch, 1))
    eager_t, kiln_t, correct = [], [], True
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for length in range(1, 9):  # fill the cache of entries: one per length
            cache = torch.randn(batch, length, dim)
            correct &= torch.allclose(compiled(token, cache), model(token, cache), atol=1e-5)
        for length in range(9, 9 + args.calls):  # every call past the limit is a new length
            cache = torch.randn(batch, length, dim)
            t0 = time.perf_counter()
            ref = model(token, cache)
            t1 = time.perf_counter()
            out = compiled(token, cache)
            t2 = time.perf_counter()
            eager_t.append(t1 - t0)
            kiln_t.append(t2 - t1)
            correct &= torch.allclose(out, ref, atol=1e-5)
    cf = compiled._kiln_compiled
    limit_warnings = [w for w in caught if issubclass(w.category, kiln.KilnRecompileLimitWarning)]
    eager_us = statistics.median(eager_t) * 1e6
    kiln_us = statistics.median(kiln_t) * 1e6
    return {
        "graph_break": args.graph_break,
        "backend": args.backend,
        "calls_past_limit": args.calls,
        "eager_us_per_call": round(eager_us, 1),
        "kiln_us_per_call_past_limit": round(kiln_us, 1),
        "kiln_over_eager": round(kiln_us / eager_us, 3),
        "compiles": cf.compiles,
        "entries": len(cf.entries),
        "limit_warnings": len(limit_warnings),
        "correct": bool(correct),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--break", dest="graph_break", action="store_true")
    p.add_argument("--backend", default="eager")
    p.add_argument("--calls", type=int, default=200)
    print(json.dumps(run(p.parse_args())))


if __name__ == "__main__":
    main()
