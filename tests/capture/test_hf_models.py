"""Real code: Hugging Face GPT-2 and BERT (small configs, random weights, no downloads) through
kiln's capture with a graph-counting eager backend, compared with eager on fresh inputs."""

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


@pytest.mark.parametrize("make", [_gpt2, _bert], ids=["gpt2", "bert"])
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
    assert backend.graphs, "no graph was captured"
    # the graphs saw the parameters as inputs, never as frozen constants
    for gm in backend.graphs:
        assert not [n for n in gm.graph.nodes if n.op == "get_attr"], gm.code
    # later calls ran compiled entries: no recompiles for same-shaped inputs
    assert len(state.entries) == 1
