"""One-row matrix products as reductions: a batch-1 decode step's linear layers (GPU path).

Takes an ATen graph with `val` metadata; rewrites it in place. `mm(a, b)` whose `a` has exactly
one row (a static 1, not a symbolic size that was 1 when first seen) becomes

    sum(a.t().float() * b.float(), dim=0, keepdim=True).to(dtype)      # [1, N]

a reduction over K that the code generator makes one Triton kernel of: the casts and the
product are read inside the reduction's loads, no [K, N] tensor is made, and the kernel is
launched natively like kiln's others. Products accumulate in float32, as cuBLAS's do, and are
rounded to the output dtype once.

Why: the GPU does a one-row product of a decode step in about a microsecond, but `torch.mm` costs
the host ~20 us a call (cuBLAS's heuristics, the workspace, the launch), measured on the H200
host: an 8-layer Llama decode step makes 57 of them, about 1.1 ms of a 2.8 ms step whose kernels
take the GPU 0.5 ms. A native Triton launch costs a few microseconds. torch.compile keeps these
as cuBLAS calls.

Only products of at most `MAX_WEIGHTS` elements in `b` are rewritten: past that the product is
memory-bound for long enough that cuBLAS's matrix-vector kernels, at the copy bandwidth, would
gain more GPU time than the launch saves on the host. A `b` whose rows are strided (K is not its
contiguous dimension: an `x @ w` with `w` [K, N] row-major) is kept too: the reduction would read
it across rows. The rewrite runs on the GPU path only (the device's rewrite list), whatever the
tensors' device, so the Triton interpreter's tests on the CPU see the same graph as the GPU.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from . import rewrite
from .meta import ensure_meta, fake_call

aten = torch.ops.aten
MAX_WEIGHTS = 1 << 26  # elements of b: 64 M (Llama's 32000 x 1024 head is 33 M)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@rewrite("matvec_reductions")
def matvec_reductions(gm: torch.fx.GraphModule, example_inputs) -> int:
    """One-row `mm` products become float32 reductions (module doc); gives how many."""
    ensure_meta(gm, example_inputs)
    found = [n for n in gm.graph.nodes if _one_row_product(n)]
    if not found:
        return 0
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    for node in found:
        _rewrite(gm.graph, node, mode)
    gm.recompile()
    return len(found)


def _one_row_product(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten.mm.default or node.kwargs:
        return False
    a, b = node.args
    val, bval = node.meta.get("val"), getattr(b, "meta", {}).get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(bval, torch.Tensor):
        return False
    sizes = (*val.shape, *bval.shape, *bval.stride())
    if not all(type(s) is int for s in sizes):  # symbolic sizes: keep the cuBLAS call
        return False
    k, n = bval.shape
    return (
        val.shape[0] == 1
        and val.dtype in _DTYPES
        and bval.dtype == val.dtype
        and 1 < k
        and k * n <= MAX_WEIGHTS
        and bval.stride(0) == 1  # K contiguous in b: each output reads one row of it
    )


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, mode: FakeTensorMode) -> None:
    a, b = node.args
    dtype = node.meta["val"].dtype
    made = []

    def call(target, *args, **kwargs):
        made.append(graph.call_function(target, args, kwargs))
        return made[-1]

    with graph.inserting_before(node):
        column = call(aten.permute.default, a, [1, 0])  # [K, 1]
        if dtype != torch.float32:
            column = call(aten._to_copy.default, column, dtype=torch.float32)
            b = call(aten._to_copy.default, b, dtype=torch.float32)
        total = call(aten.sum.dim_IntList, call(aten.mul.Tensor, column, b), [0], True)
        if dtype != torch.float32:
            total = call(aten._to_copy.default, total, dtype=dtype)
    values: dict = {}  # (the last node made has the product's layout: [1, N], row-major)
    for n in made:
        fake_call(n, mode, values)
    node.replace_all_uses_with(total)
    graph.erase_node(node)
