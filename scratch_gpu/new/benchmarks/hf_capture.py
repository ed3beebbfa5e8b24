"""Hugging Face GPT-2, BERT and Llama through kiln's capture and through torch.compile's (issue 3).

Builds each model from a small config with random weights (no downloads), compiles it with a
graph-counting backend under kiln and under torch.compile, checks both against eager on fresh
random token ids, and prints graphs and graph breaks for each.

Usage: python benchmarks/hf_capture.py
"""

from __future__ import annotations

import sys

import torch


def models():
    from transformers import (
        BertConfig,
        BertModel,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    gpt2 = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=1000,
        n_positions=128,
        bos_token_id=0,
        eos_token_id=0,
    )
    bert = BertConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=1000,
    )
    llama = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=1000,
        max_position_embeddings=128,
    )
    yield "gpt2", lambda: GPT2LMHeadModel(gpt2).eval()
    yield "bert", lambda: BertModel(bert).eval()
    yield "llama", lambda: LlamaForCausalLM(llama).eval()


def run(compile_fn, make_model) -> dict:
    torch.manual_seed(0)
    model = make_model()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = compile_fn(model, backend)
    ok = True
    with torch.no_grad():
        for _ in range(3):
            ids = torch.randint(0, 1000, (2, 16))
            ok &= torch.allclose(compiled(ids)[0], model(ids)[0], atol=1e-5)
    return {"graphs": len(graphs), "correct": bool(ok), "compiled": compiled}


def main() -> int:
    import torch._dynamo  # the baseline only; kiln never imports it

    import kiln

    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}")
    print("| model | compiler | graphs | graph breaks | matches eager |")
    print("| --- | --- | --- | --- | --- |")
    for name, make in models():
        k = run(lambda m, b: kiln.compile(m, backend=b), make)
        kbreaks = len({(r, w) for r, w, _ in k["compiled"]._kiln_compiled.breaks})
        print(f"| {name} | kiln | {k['graphs']} | {kbreaks} | {k['correct']} |")
        torch._dynamo.reset()
        t = run(lambda m, b: torch.compile(m, backend=b), make)
        torch._dynamo.reset()
        ids = torch.randint(0, 1000, (2, 16))
        explain = torch._dynamo.explain(make())(ids)
        print(
            f"| {name} | torch.compile | {t['graphs']} | {explain.graph_break_count} | "
            f"{t['correct']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
