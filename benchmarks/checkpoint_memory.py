"""What gradient checkpointing saves: an HF Llama training step, eager vs torch.compile vs kiln.

Takes command-line options (model size, batch, the compilers to run); prints a Markdown table
(and, with --json, a JSON file). Each row is one compiler with Hugging Face's gradient
checkpointing off, on as HF sets it (`gradient_checkpointing_enable()`: `use_reentrant=False`)
or on in the reentrant form; its columns are

- saved: bytes of the distinct tensor storages the forward keeps for the backward, less the
  parameters' (alive whatever the step does), measured with
  `torch.autograd.graph.saved_tensors_hooks` around a real forward (a compiled step's saved
  tensors are those its autograd.Function saves; inside an eager non-reentrant checkpoint
  torch's own hooks replace these, as it saves nothing there);
- peak: `torch.cuda.max_memory_allocated()` during one forward + backward, above what was
  allocated before it (on the CPU: the most bytes of storages made during it alive at once,
  counted by `kiln.bench.live_bytes.LiveBytes`);
- step: median time of forward + backward (after warm-up; a compiled row's first call is its
  compile, not counted);
- max |grad - eager|: the largest difference of any parameter's gradient from the eager step
  with the same setting, on the same fresh random batch.

Run: `python benchmarks/checkpoint_memory.py` (CPU, a small config); on a GPU:
`python benchmarks/checkpoint_memory.py --device cuda --layers 8 --hidden 1024 --seq 1024`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

SETTINGS = {"off": None, "on (HF default)": {}, "on (reentrant)": {"use_reentrant": True}}


def build(args, setting):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=max(1, args.heads // 2),
        max_position_embeddings=args.seq,
    )
    model = LlamaForCausalLM(cfg).to(args.device)
    model.train()
    kwargs = SETTINGS[setting]
    if kwargs is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)
    return model


def compiled(model, compiler: str):
    if compiler == "eager":
        return model
    if compiler == "torch.compile":
        return torch.compile(model)
    import kiln

    return kiln.compile(model)


def saved_bytes(fn, params) -> int:
    """Bytes of the distinct storages saved for backward while `fn()` runs, parameters excluded."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in skip and s.device.type != "meta":
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(args, compiler: str, setting: str, ids, reference) -> dict:
    model = build(args, setting)
    step_model = compiled(model, compiler)
    params = list(model.parameters())

    def forward():
        return step_model(input_ids=ids, labels=ids).loss

    for _ in range(2):  # compile and warm up
        model.zero_grad(set_to_none=True)
        forward().backward()
    model.zero_grad(set_to_none=True)
    row: dict = {"compiler": compiler, "checkpointing": setting}
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    if args.device == "cuda":
        row["saved_bytes"], loss = saved_bytes(forward, params)
        loss.backward()
        torch.cuda.synchronize()
        row["peak_bytes"] = torch.cuda.max_memory_allocated() - base
    else:  # the CPU has no allocator statistics: count live storages (kiln.bench.live_bytes)
        from kiln.bench.live_bytes import LiveBytes

        with LiveBytes() as live:
            row["saved_bytes"], loss = saved_bytes(forward, params)
            loss.backward()
        row["peak_bytes"] = live.peak
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    times = []
    for _ in range(args.steps):
        model.zero_grad(set_to_none=True)
        sync(args.device)
        t0 = time.perf_counter()
        forward().backward()
        sync(args.device)
        times.append(time.perf_counter() - t0)
    row["step_ms"] = statistics.median(times) * 1e3
    row["loss"] = float(loss)
    if reference is not None:
        row["max_grad_diff"] = max(float((grads[n] - g).abs().max()) for n, g in reference.items())
    row["_grads"] = grads
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--compilers",
        default=None,
        help="comma-separated from eager,torch.compile,kiln (default: all on cuda, "
        "eager and kiln on cpu)",
    )
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args()
    default = "eager,torch.compile,kiln" if args.device == "cuda" else "eager,kiln"
    compilers = (args.compilers or default).split(",")
    torch.manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device)
    rows = []
    for setting in SETTINGS:
        reference = None
        for compiler in ["eager", *[c for c in compilers if c != "eager"]]:
            row = measure(args, compiler, setting, ids, reference)
            if compiler == "eager":
                reference = row["_grads"]
            if compiler in compilers:
                rows.append(row)
            print(f"done: {compiler}, checkpointing {setting}", file=sys.stderr)
    print(
        f"\nHF Llama, {args.layers} layers, d{args.hidden}, batch {args.batch} x {args.seq}, "
        f"float32, {args.device}; torch {torch.__version__}\n"
    )
    peak = True
    head = "| compiler | checkpointing | saved (MiB) |" + (" peak (MiB) |" if peak else "")
    print(head + " step (ms) | loss | max abs grad diff vs eager |")
    print("|" + "---|" * (head.count("|") + 2))
    for r in rows:
        cells = [r["compiler"], r["checkpointing"], f"{r['saved_bytes'] / 2**20:.1f}"]
        if peak:
            cells.append(f"{r['peak_bytes'] / 2**20:.1f}")
        diff = r.get("max_grad_diff")
        cells += [f"{r['step_ms']:.1f}", f"{r['loss']:.4f}", "-" if diff is None else f"{diff:.2e}"]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "_grads"} for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
