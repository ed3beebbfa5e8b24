"""How many kernels and extern (ATen) calls kiln generates for each benchmark model.

Compiles each model of the suite with kiln (default backend) under `KILN_LOGS=output_code`, runs
it once (a training step when `:train` is given: forward, loss, backward), and counts, from the
generated code kiln printed, the kernels (`@triton.jit` functions or C++ `extern "C"` kernels)
and the ATen calls of the wrappers. It reads only what `output_code` prints, so the same script
measures any kiln version: run it once with `PYTHONPATH=<old>/src` and once with the new tree to
see that a refactor left the generated code unchanged (issue "one device-neutral pipeline").

Usage: PYTHONPATH=src python benchmarks/kernel_counts.py --device cuda \
           --models nanogpt:train,hf_bert,hf_gpt2 [--size large] [--dtype float32] [--json out]
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import sys

os.environ["KILN_LOGS"] = "output_code"


def _count(text: str) -> dict:
    graphs = text.count("wrapper:\n")
    triton = len(re.findall(r"@triton\.jit\s*\ndef kernel", text))
    cpp = len(re.findall(r'extern "C"[^\n]*\bkernel\d+', text))
    aten = len(re.findall(r"^\s+(?:\w+ = )?(aten_\w+)\(", text, flags=re.M))
    return {"graphs": graphs, "kernels": triton + cpp, "aten_calls": aten}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--size", default="small")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    import kiln
    from kiln.bench.suite import load_models, models_dir

    models = load_models(models_dir())
    dtype = getattr(torch, args.dtype)
    out = {}
    for spec in args.models.split(","):
        name, *flags = spec.split(":")
        train = "train" in flags
        kiln.reset()
        buf = io.StringIO()
        handler = logging.StreamHandler(buf)
        logging.getLogger("kiln").addHandler(handler)
        try:
            model, inputs = models[name].factory(args.device, dtype, args.size, 0)
            model.train(train)
            compiled = kiln.compile(model)
            if train:
                out_t = compiled(*inputs)
                out_t = out_t[0] if isinstance(out_t, (tuple, list)) else out_t
                out_t = getattr(out_t, "logits", out_t)
                out_t.float().square().mean().backward()
            else:
                with torch.no_grad():
                    compiled(*inputs)
            if args.device == "cuda":
                torch.cuda.synchronize()
        finally:
            logging.getLogger("kiln").removeHandler(handler)
        out[spec] = _count(buf.getvalue())
        print(f"{spec:28s} {json.dumps(out[spec])}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
