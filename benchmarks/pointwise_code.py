"""The pointwise chain's generated GPU code from kiln and torch.compile, and each one's
back-to-back kernel time, in one process (a kernel-level comparison for the speed issue).

    PYTHONPATH=src python3 benchmarks/pointwise_code.py [--model pointwise] [--out DIR]

Writes `kiln_code.txt` (what `KILN_LOGS=output_code` prints) and `torch_code.txt`
(torch.compile's generated files from its cache folder: set a fresh TORCHINDUCTOR_CACHE_DIR)
to `--out`, and prints each compiled call's back-to-back time (median of 3 blocks of 30
calls, CUDA events, no synchronize between calls).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


def b2b_ms(fn, inputs) -> float:
    """`fn(*inputs)`'s back-to-back time, as `kiln bench` takes it (kiln.bench.measure)."""
    from kiln.bench.measure import back_to_back_medians

    return back_to_back_medians([lambda _: fn(*inputs)], ())[0]


def _inductor_sources() -> str:
    """torch.compile's generated Python/Triton files of this process, from its cache folder
    (run with a fresh TORCHINDUCTOR_CACHE_DIR to see only this model's)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    texts = []
    for root, _, files in os.walk(cache_dir()):
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(root, name)) as f:
                    text = f.read()
                if "@triton.jit" in text or "def call(" in text:
                    texts.append(f"# ==== {name}\n{text}")
    return "\n".join(texts)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="pointwise")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--out", default=".")
    p.add_argument("--no-torch", action="store_true", help="kiln and eager only")
    args = p.parse_args()
    import kiln
    from kiln.bench.suite import load_models

    bench = load_models(os.path.join(os.path.dirname(__file__), "models"))[args.model]
    model, inputs = bench.factory("cuda", getattr(torch, args.dtype), "large", 0)
    os.makedirs(args.out, exist_ok=True)
    kiln.set_logs("output_code")
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logging.getLogger("kiln").addHandler(handler)
    with torch.no_grad():
        kfn = kiln.compile(model)
        kfn(*inputs)
        torch.cuda.synchronize()
        with open(os.path.join(args.out, "kiln_code.txt"), "w") as f:
            f.write(buf.getvalue())
        runs = [("eager", model), ("kiln", kfn)]
        if not args.no_torch:
            tfn = torch.compile(model)
            tfn(*inputs)
            torch.cuda.synchronize()
            with open(os.path.join(args.out, "torch_code.txt"), "w") as f:
                f.write(_inductor_sources())
            runs += [("torch", tfn), ("kiln", kfn)]
        eager = b2b_ms(model, inputs)
        for name, fn in runs:
            print(f"{name}: {b2b_ms(fn, inputs):.4f} ms back to back (eager {eager:.4f})")


if __name__ == "__main__":
    main()
