"""nanoGPT training with a new sequence length on every step: two compiles, eager's gradients.

The benchmark suite's nanoGPT (benchmarks/models/nanogpt.py: embeddings, causal SDPA blocks,
a tied head) takes lengths drawn from 64..256. The first call compiles for its length; the
second, at another length, makes the sequence dimension dynamic (automatic dynamic shapes) and
AOT autograd traces forward and backward once with a symbolic length; every later length reuses
them. Before, each new length was an AOT trace and a build of its own. Each step's loss and
every parameter's gradient are compared with eager on a copy of the model.
The second test does the same through kiln's code generator (C++ kernels with symbolic sizes)
and counts the graphs it compiled and the C++ builds.
"""

from __future__ import annotations

import copy
import random
import sys

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.autograd import compile as aot
from kiln.backends import builtin
from kiln.bench import suite


def _gpt(n_layer: int):
    suite.load_models(suite.models_dir())
    nanogpt = sys.modules["kiln_benchmark_models.nanogpt"]
    cfg = nanogpt.GPTConfig(block_size=256, vocab_size=64, n_layer=n_layer, n_head=2, n_embd=32)
    return nanogpt.GPT(cfg)


@pytest.fixture
def aot_traces(monkeypatch):
    made: list = []
    for name in ("trace_training", "trace_inference"):
        real = getattr(aot, name)

        def counting(*args, _real=real, _name=name, **kwargs):
            made.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(aot, name, counting)
    kiln.reset()
    yield made
    kiln.reset()


def _train_at_lengths(backend: str, n_layer: int, steps: int, seed: int):
    torch.manual_seed(seed)
    model = _gpt(n_layer).train()
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=backend)
    lengths = random.Random(seed).sample(range(64, 257), steps)
    for t in lengths:
        idx = torch.randint(0, 64, (2, t))
        targets = torch.randint(0, 64, (2, t))
        loss = F.cross_entropy(compiled(idx).reshape(-1, 64), targets.reshape(-1))
        loss.backward()
        expected = F.cross_entropy(ref(idx).reshape(-1, 64), targets.reshape(-1))
        expected.backward()
        torch.testing.assert_close(loss, expected)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
    return compiled._kiln_compiled


def test_nanogpt_trains_at_lengths_64_to_256_with_two_compiles(aot_traces):
    # the graphs the code generator gets, on eager kernels: fast enough for many lengths
    cf = _train_at_lengths("aot_eager_decomp_partition", n_layer=1, steps=6, seed=0)
    assert cf.compiles <= 2, f"{cf.compiles} compiles"
    assert len(aot_traces) <= 2, f"{len(aot_traces)} AOT traces"


def test_nanogpt_trains_at_eight_lengths_through_the_code_generator(aot_traces, monkeypatch):
    # kiln's default backend, 8 lengths from 64..256: the symbolic forward and backward reach
    # the code generator once each and are built once (no per-length build or eager fallback),
    # so the whole run makes 2 compiles and at most 4 graphs for the code generator (a static
    # forward and backward for the first length, a symbolic pair for every later one)
    import kiln.codegen as codegen
    from kiln.runtime import cpp_builder

    graphs: list = []
    real = codegen.compile_graph

    def counting(*args, **kwargs):
        graphs.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(codegen, "compile_graph", counting)
    before = len(builtin.fallbacks())
    builds = cpp_builder.STATS["compiles"] + cpp_builder.STATS["disk_hits"]
    cf = _train_at_lengths("inductor", n_layer=2, steps=8, seed=1)
    assert cf.compiles <= 2, f"{cf.compiles} compiles"
    assert len(aot_traces) <= 2, f"{len(aot_traces)} AOT traces"
    assert builtin.fallbacks()[before:] == []
    assert len(graphs) <= 4, f"{len(graphs)} graphs given to the code generator"
    built = cpp_builder.STATS["compiles"] + cpp_builder.STATS["disk_hits"] - builds
    assert built <= 4, f"{built} C++ builds"
