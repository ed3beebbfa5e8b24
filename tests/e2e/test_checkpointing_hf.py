"""Hugging Face gradient checkpointing compiles: a small Llama trained with
`gradient_checkpointing_enable()` (HF's default, `use_reentrant=False`, and the reentrant form)
gives eager's loss and gradients on fresh inputs in one graph, and what the compiled step keeps
between forward and backward (the activations AOT autograd's partition saves) is well below
what the same model compiled without checkpointing keeps: each checkpointed decoder layer's
activations are recomputed in the backward, not saved."""

from __future__ import annotations

import copy

import pytest
import torch

import kiln
from kiln.autograd import aot_compile
from kiln.autograd.backend import eager_graph
from kiln.autograd.partition import value_bytes
from kiln.backends import builtin

transformers = pytest.importorskip("transformers")

VOCAB = 128
MODES = {"plain": None, "hf_default": {}, "reentrant": {"use_reentrant": True}}


def _llama(mode: str):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(cfg)
    model.train()
    kwargs = MODES[mode]
    if kwargs is not None:
        # HF's own switch; `None` is its default (use_reentrant=False)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)
    return model


def _partitions_backend(store: list):
    """AOT autograd on eager kernels, keeping the compiled objects to read their partitions."""

    def backend(gm, example_inputs):
        compiled = aot_compile(gm, example_inputs, fw_compiler=eager_graph, bw_compiler=eager_graph)
        store.append(compiled)
        return compiled

    return backend


def _saved_activation_bytes(store: list) -> tuple[int, list[str]]:
    """Bytes of the forward's values the partitions keep for the backward, less the inputs
    (parameters are alive whatever the partition does), and the partitions' notes."""
    total, notes = 0, []
    for compiled in store:
        for part in compiled.partitions.values():
            inputs = {n.name for n in part.fw.graph.find_nodes(op="placeholder")}
            out = next(n for n in reversed(part.fw.graph.nodes) if n.op == "output")
            kept = list(out.args[0])[part.num_fw_outputs :]
            total += sum(value_bytes(v) for v in kept if v.name not in inputs)
            notes += part.notes
    return total, notes


def _train_and_compare(mode: str) -> tuple[int, list[str]]:
    eager = _llama(mode)
    model = copy.deepcopy(eager)
    store: list = []
    compiled = kiln.compile(model, backend=_partitions_backend(store), fullgraph=True)
    before = len(builtin.fallbacks())
    for _ in range(2):
        ids = torch.randint(0, VOCAB, (2, 24))
        for m in (eager, model):
            m.zero_grad()
        want = eager(input_ids=ids, labels=ids).loss
        want.backward()
        got = compiled(input_ids=ids, labels=ids).loss
        got.backward()
        torch.testing.assert_close(got, want)
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert [str(f) for f in builtin.fallbacks()[before:]] == []
    return _saved_activation_bytes(store)


def test_llama_gradient_checkpointing_saves_less_and_matches_eager():
    plain, plain_notes = _train_and_compare("plain")
    assert not any(n.startswith("checkpointed:") for n in plain_notes)
    for mode in ("hf_default", "reentrant"):
        saved, notes = _train_and_compare(mode)
        assert any(n.startswith("checkpointed:") for n in notes), (mode, notes)
        # each decoder layer keeps its input instead of its attention and MLP activations
        assert saved * 4 < plain, (mode, saved, plain)
