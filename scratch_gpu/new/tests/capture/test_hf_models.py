"""Real code: Hugging Face GPT-2, BERT and Llama (small configs, random weights, no downloads)
through kiln's capture with a graph-counting eager backend, compared with eager on fresh inputs.
transformers sets and resets a ContextVar (its output collector) around every forward: kiln
traces through it, so each model is one graph with no break."""

import pytest
import torch
from harness import CountingBackend

import kiln

transformers = pytest.importorskip("transformers")


def _gpt2():
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=1000,
        n_positions=128,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(cfg).eval(), "logits"


def _bert():
    cfg = transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=1000,
    )
    return transformers.BertModel(cfg).eval(), "last_hidden_state"


def _llama():
    cfg = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=1000,
        max_position_embeddings=128,
    )
    return transformers.LlamaForCausalLM(cfg).eval(), "logits"


@pytest.mark.parametrize("make", [_gpt2, _bert, _llama], ids=["gpt2", "bert", "llama"])
def test_hf_model_compiles_and_matches_eager(make):
    torch.manual_seed(0)
    model, field = make()
    backend = CountingBackend()
    cm = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            ids = torch.randint(0, 1000, (2, 16))
            torch.testing.assert_close(getattr(cm(ids), field), getattr(model(ids), field))
    state = cm._kiln_compiled
    assert state.eager_reason is None, state.eager_reason
    assert not state.breaks, state.breaks
    assert len(backend.graphs) == 1
    # the graphs saw the parameters as inputs, never as frozen constants
    for gm in backend.graphs:
        assert not [n for n in gm.graph.nodes if n.op == "get_attr"], gm.code
    # later calls ran compiled entries: no recompiles for same-shaped inputs
    assert len(state.entries) == 1


def test_hf_output_hooks_read_the_collector_inside_the_graph():
    """With output_hidden_states=True transformers' forward hooks read the collector the forward
    set (ContextVar.get) and append to it: still one graph, hidden states equal to eager's."""
    torch.manual_seed(0)
    model, _ = _gpt2()
    with torch.no_grad():
        model(torch.randint(0, 1000, (2, 16)), output_hidden_states=True)  # installs the hooks
        backend = CountingBackend()
        cm = kiln.compile(model, backend=backend)
        for _ in range(3):
            ids = torch.randint(0, 1000, (2, 16))
            got, expected = (
                cm(ids, output_hidden_states=True),
                model(ids, output_hidden_states=True),
            )
            torch.testing.assert_close(got.logits, expected.logits)
            assert len(got.hidden_states) == len(expected.hidden_states) == 3
            for g, e in zip(got.hidden_states, expected.hidden_states):
                torch.testing.assert_close(g, e)
    state = cm._kiln_compiled
    assert state.eager_reason is None and not state.breaks, (state.eager_reason, state.breaks)
    assert len(backend.graphs) == 1 and len(state.entries) == 1
