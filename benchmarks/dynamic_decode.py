"""Greedy decoding with a growing KV cache: eager, torch.compile(dynamic=None) and kiln, each in
a fresh process.

HF Llama (random weights from a `LlamaConfig`, no download: hidden 1024, 8 layers, 16 heads,
intermediate 2816, vocabulary 32000), batch 1, a 64-token prompt, then 128 new tokens chosen
greedily, each step calling the compiled forward with HF's dynamic KV cache (`DynamicCache`,
`use_cache=True`): the prompt step, then one token per step while the cache grows. Run in
bfloat16 (speed; greedy tokens may drift for both compilers, so it checks the logits of every
step against eager's on the same tokens instead) and in float32 (the tokens must equal eager's).

For each compiler and dtype it reports the compiles, tokens per second of a first generation
(compiles included) and of a second one (steady), the new tokens equal to eager's, and the
largest difference of the logits from eager's over the steps, teacher-forced on eager's tokens.

    PYTHONPATH=src python3 benchmarks/dynamic_decode.py --out results/dynamic_decode.json
    PYTHONPATH=src python3 benchmarks/dynamic_decode.py --tiny --device cpu   # smoke test

`--tiny` uses a 2-layer, 64-wide Llama, a 8-token prompt and 16 new tokens; without
transformers (or with `--stand-in`) a small decoder written here with a KV cache of its own
(a list of tensors that grows), marked "stand-in": it only checks that the script runs.
Each compiler runs in a fresh process and compiles are counted as fresh_process.py says.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from fresh_process import compiled_for, emit, run_worker, write_json  # noqa: E402

COMPILERS = ("eager", "torch", "kiln")


class StandInCache:
    """A KV cache for the stand-in: one (keys, values) pair per layer, grown by `cat`."""

    def __init__(self):
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []


class StandIn(nn.Module):
    """A small decoder LM with a growing KV cache, for the smoke test only."""

    def __init__(self, vocab=256, dim=64, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        cache = past_key_values if past_key_values is not None else StandInCache()
        h = self.embed(input_ids)
        for i, (qkv, out) in enumerate(zip(self.qkv, self.out)):
            q, k, v = qkv(h).chunk(3, dim=-1)
            if i < len(cache.layers):
                k = torch.cat([cache.layers[i][0], k], dim=1)
                v = torch.cat([cache.layers[i][1], v], dim=1)
                cache.layers[i] = (k, v)
            else:
                cache.layers.append((k, v))
            causal = q.shape[1] > 1
            att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            h = h + out(att)
        return self.head(h), cache


def build_model(args, dtype):
    torch.manual_seed(0)
    try:
        if args.stand_in:
            raise ImportError("--stand-in")
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        if not args.tiny:
            raise SystemExit(
                "dynamic_decode.py: transformers is not installed; install it, or pass --tiny "
                "for a smoke test with a stand-in model"
            ) from None
        return StandIn().to(args.device, dtype).eval(), "stand-in", 256
    if args.tiny:
        cfg = LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            vocab_size=256,
            max_position_embeddings=512,
        )
    else:
        cfg = LlamaConfig(
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=16,
            vocab_size=32000,
            max_position_embeddings=2048,
        )
    model = LlamaForCausalLM(cfg).to(args.device, dtype).eval()
    return model, "hf-llama" + ("-tiny" if args.tiny else ""), cfg.vocab_size


def new_cache(kind: str):
    if kind == "stand-in":
        return StandInCache()
    from transformers import DynamicCache

    return DynamicCache()


def step(fn, kind, ids, cache):
    """One forward: (logits of the last position, the cache)."""
    if kind == "stand-in":
        logits, cache = fn(input_ids=ids, past_key_values=cache, use_cache=True)
        return logits[:, -1], cache
    out = fn(input_ids=ids, past_key_values=cache, use_cache=True)
    return out.logits[:, -1], out.past_key_values


def generate(fn, kind, prompt, new_tokens, sync):
    """Greedy decoding: (new tokens, logits per step, seconds)."""
    cache = new_cache(kind)
    ids, tokens, logits = prompt, [], []
    sync()
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        last, cache = step(fn, kind, ids, cache)
        ids = last.argmax(dim=-1, keepdim=True)
        tokens.append(ids)
        logits.append(last)
    sync()
    return torch.cat(tokens, dim=1), logits, time.perf_counter() - t0


def teacher_forced(fn, kind, prompt, tokens):
    """Logits per step when the inputs are `tokens` (eager's), whatever `fn` would choose."""
    cache = new_cache(kind)
    ids, out = prompt, []
    for i in range(tokens.shape[1]):
        last, cache = step(fn, kind, ids, cache)
        out.append(last.float())
        ids = tokens[:, i : i + 1]
    return out


def worker(args) -> dict:
    dtype = getattr(torch, args.dtype)
    model, kind, vocab = build_model(args, dtype)
    prompt_len, new_tokens = (8, 16) if args.tiny else (args.prompt, args.new_tokens)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocab, (1, prompt_len), generator=gen).to(args.device)
    cuda = args.device.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    with torch.no_grad():
        ref_tokens, ref_logits, _ = generate(model, kind, prompt, new_tokens, sync)
        fn, compile_counts = compiled_for(args.only, model)
        tokens, _, first_s = generate(fn, kind, prompt, new_tokens, sync)
        _, _, steady_s = generate(fn, kind, prompt, new_tokens, sync)
        forced = teacher_forced(fn, kind, prompt, ref_tokens)
    diffs = [(a - b.float()).abs().max().item() for a, b in zip(forced, ref_logits)]
    result = {
        "compiler": args.only,
        "model": kind,
        "device": args.device,
        "dtype": args.dtype,
        "prompt": prompt_len,
        "new_tokens": new_tokens,
        "tokens_per_s_first": round(new_tokens / first_s, 2),
        "tokens_per_s_steady": round(new_tokens / steady_s, 2),
        "tokens_equal_eager": int((tokens == ref_tokens).sum().item()),
        "all_tokens_equal_eager": bool(torch.equal(tokens, ref_tokens)),
        "max_logit_diff_teacher_forced": max(diffs),
        "logit_scale": max(b.float().abs().max().item() for b in ref_logits),
    }
    result.update(compile_counts())
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--tiny", action="store_true", help="a tiny model and few tokens: smoke test")
    p.add_argument("--stand-in", action="store_true", help="with --tiny: the stand-in model")
    p.add_argument("--compilers", default=",".join(COMPILERS))
    p.add_argument("--out", default=None, help="write the JSON results here")
    p.add_argument("--only", choices=COMPILERS, help=argparse.SUPPRESS)  # the worker process
    p.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.only:
        emit(worker(args))
        return
    results = []
    for dtype in args.dtypes.split(","):
        for name in args.compilers.split(","):
            argv = ["--only", name, "--device", args.device, "--dtype", dtype]
            argv += ["--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens)]
            argv += ["--tiny"] * args.tiny + ["--stand-in"] * args.stand_in
            results.append(run_worker(__file__, argv, {"compiler": name, "dtype": dtype}))
            print(json.dumps(results[-1]), flush=True)
    write_json(args.out, "dynamic_decode", results)


if __name__ == "__main__":
    main()
