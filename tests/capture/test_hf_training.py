"""Hugging Face models trained on the CPU (small configs, random weights, no downloads):
forward with `labels=` (the loss computed inside the model) and backward, through kiln's
capture and AOT autograd (`aot_eager`), compared with an eager twin on fresh inputs: loss
and every parameter's gradient. No frame runs eagerly, no graph falls back to eager kernels
(`builtin.fallbacks()`), and the graph and break counts are what the model needs."""

import copy

import pytest
import torch

import kiln
from kiln.backends import builtin

transformers = pytest.importorskip("transformers")

VOCAB = 128


def _gpt2():
    return transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=2,
            vocab_size=VOCAB,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
        )
    )


def _gpt_neo():  # tensor constants in its joint graph (KeyError: _tensor_constant0 before)
    return transformers.GPTNeoForCausalLM(
        transformers.GPTNeoConfig(
            num_layers=2,
            hidden_size=64,
            num_heads=2,
            attention_types=[[["global", "local"], 1]],
            max_position_embeddings=64,
            window_size=8,
            vocab_size=VOCAB,
        )
    )


def _falcon():  # tensor constants, as GPT-Neo
    return transformers.FalconForCausalLM(
        transformers.FalconConfig(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=2, vocab_size=VOCAB
        )
    )


def _mixtral():  # MoE through transformers::grouped_mm_fallback (an old-style Function)
    return transformers.MixtralForCausalLM(
        transformers.MixtralConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            max_position_embeddings=64,
            vocab_size=VOCAB,
        )
    )


def _bloom():  # alibi.baddbmm with symbolic sizes (it broke the graph before issue 31's fix)
    return transformers.BloomForCausalLM(
        transformers.BloomConfig(n_layer=2, hidden_size=64, n_head=2, vocab_size=VOCAB)
    )


# name: (model factory, lengths, graphs, breaks). Lengths 16 then 24: a static entry, then
# one with symbolic lengths. Bloom's `alibi.baddbmm` broke the graph once sizes were symbolic
# (5 graphs, 1 break: its C++ fake kernel reads concrete sizes); capture's fake propagation now
# runs under the Python dispatcher, and Bloom's third length reuses the one symbolic entry.
MODELS = {
    "gpt2": (_gpt2, (16, 16, 24), 2, 0),
    "gpt_neo": (_gpt_neo, (16, 24), 2, 0),
    "falcon": (_falcon, (16, 24), 2, 0),
    "mixtral": (_mixtral, (16, 24), 2, 0),
    "bloom": (_bloom, (16, 24, 32), 2, 0),
}


def train_and_compare(make, lengths, backend="aot_eager"):
    torch.manual_seed(0)
    eager = make().train()
    model = copy.deepcopy(eager)
    cm = kiln.compile(model, backend=backend)
    before = len(builtin.fallbacks())
    for n in lengths:
        ids = torch.randint(0, VOCAB, (2, n))
        torch.manual_seed(1)  # dropout draws the same masks in both
        expected = eager(ids, labels=ids).loss
        torch.manual_seed(1)
        got = cm(ids, labels=ids).loss
        torch.testing.assert_close(got, expected)
        expected.backward()
        got.backward()
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            if p.grad is None:
                assert q.grad is None, name
                continue
            torch.testing.assert_close(q.grad, p.grad, msg=lambda m, name=name: f"{name}: {m}")
        eager.zero_grad()
        model.zero_grad()
    fallbacks = builtin.fallbacks()[before:]
    state = cm._kiln_compiled
    units = [state, *state.continuations.values()]
    eager_units = [f"{u.label}: {u.eager_reason}" for u in units if u.eager_reason]
    graphs = sum(len(u.graph_modules) for u in units)
    return graphs, len(set(state.breaks)), fallbacks, eager_units


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hf_training_matches_eager_without_fallbacks(name):
    make, lengths, graphs, breaks = MODELS[name]
    got_graphs, got_breaks, fallbacks, eager_units = train_and_compare(make, lengths)
    assert eager_units == []
    assert fallbacks == []
    assert (got_graphs, got_breaks) == (graphs, breaks)
