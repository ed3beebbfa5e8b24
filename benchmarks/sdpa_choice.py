"""Which SDPA backend a suite model's attention gets, on real tensors and on fake ones (GPU).

Runs `MODELS[name]` (size "large", bfloat16, CUDA) once eagerly with
`F.scaled_dot_product_attention` wrapped: for its first call, prints the query's and key's
layouts and the mask's, `torch._fused_sdp_choice` on those tensors (0 = math, 1 = flash,
2 = memory-efficient, 3 = cuDNN), and the ATen attention op that `make_fx` records for the same
call on fake copies of them (what a trace under fake tensors gets). Then prints the CUDA
kernels of one eager forward.

(`torch._fused_sdp_choice` itself, called on fake tensors, answers 0 whatever the layout: under
a fake mode it runs its meta kernel. The first version of this script reported that as the
trace's choice; SDPA's composite calls the CUDA chooser directly and, for the suite's models,
records cuDNN's op.)

Usage: PYTHONPATH=src python3 benchmarks/sdpa_choice.py MODEL
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(__file__))
from gpu_compare import model  # noqa: E402


def _traced_ops(q, k, v, mask, dropout_p, is_causal, scale) -> list[str]:
    def attention(q, k, v, mask):
        return original_sdpa(q, k, v, mask, dropout_p, is_causal, scale=scale)

    mode = FakeTensorMode()
    fakes = [None if t is None else mode.from_tensor(t) for t in (q, k, v, mask)]
    with mode:
        gm = make_fx(attention)(*fakes)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    return sorted(t for t in targets if "attention" in t or "softmax" in t or "bmm" in t)


original_sdpa = F.scaled_dot_product_attention


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    args = ap.parse_args()
    m, inputs = model(args.model)
    seen: list = []

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        if not seen:
            mask = attn_mask
            seen.append(f"q {tuple(q.shape)} {q.stride()} {q.dtype}; k {k.stride()}")
            seen.append(f"mask {None if mask is None else (tuple(mask.shape), mask.stride())}")
            seen.append(f"dropout {dropout_p}, causal {is_causal}, scale {scale}, {kw}")
            real = torch._fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale=scale)
            seen.append(f"backend on real tensors {real}")
            seen.append(
                f"traced on fake tensors: {_traced_ops(q, k, v, mask, dropout_p, is_causal, scale)}"
            )
        return original_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, **kw)

    F.scaled_dot_product_attention = spy
    try:
        with torch.no_grad():
            m(*inputs)
    finally:
        F.scaled_dot_product_attention = original_sdpa
    print("\n".join(seen) or "no scaled_dot_product_attention call")
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as p:
        m(*inputs)
        torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=12))


if __name__ == "__main__":
    main()
