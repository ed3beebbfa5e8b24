"""One compile serves every size on the cuda device: graphs traced with symbolic sizes compile to
one Triton module — kernels taking size arguments, masks on symbolic extents, grids the wrapper
computes per call — and match eager on fresh random inputs at many sizes (1, odd ones, ones 16
does not divide, rows longer than the size first seen). Run in Triton's interpreter on CPU
tensors (conftest.py); each test counts Triton builds, which a per-size compile would multiply.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from tr_helpers import assert_matches_eager, require_interpreter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cg_helpers import trace_dynamic  # noqa: E402

import kiln
from kiln.codegen import compile_graph_strict

SIZES = (1, 2, 3, 7, 16, 17, 33, 70)


@pytest.fixture(autouse=True)
def _interpreter():
    require_interpreter()


def _builds() -> int:
    from kiln.runtime import triton_builder

    s = triton_builder.STATS  # (a module found on disk is a load too)
    return s["loads"] + s["memory_hits"]


def _compile(fn, example, dynamic=None):
    gm = trace_dynamic(fn, example, dynamic)
    before = _builds()
    compiled = compile_graph_strict(gm, list(example), "cuda")
    assert _builds() - before == 1, "one Triton build for the graph"
    return compiled


def _floating(a) -> bool:
    return isinstance(a, torch.Tensor) and a.is_floating_point()


def _compare(compiled, fn, args):
    """Each output as eager's, or as close to fn's float64 result as eager's is (a sum in
    another order rounds differently; tr_helpers' step 2)."""
    expected = fn(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = compiled(*args)
    assert len(got) == len(expected)
    wide = [a.double() if _floating(a) else a for a in args]
    reference = {}

    def ref(i):
        if not reference:
            out = fn(*wide)
            reference.update(enumerate(out if isinstance(out, tuple) else (out,)))
        return reference[i]

    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, e.shape)
        assert_matches_eager(g, e, lambda i=i: ref(i))


def _run_sizes(fn, make, sizes=SIZES, first=5, dynamic=None):
    """Compile `fn` once at `make(first)`, then call it at every size of `sizes` with fresh
    random inputs; no build happens after the first."""
    compiled = _compile(fn, make(first), dynamic)
    before = _builds()
    for n in sizes:
        _compare(compiled, fn, make(n))
    assert _builds() == before, "no build after the first"
    return compiled


def test_pointwise_chain_with_broadcasting():
    def f(x, y, z):
        return torch.sigmoid(x * y + z).relu() - x / (1 + y.abs())

    _run_sizes(f, lambda n: (torch.randn(n + 2, n), torch.randn(n), torch.randn(n + 2, 1)))


def test_sizes_are_kernel_arguments_and_grids_are_computed_per_call():
    compiled = _compile(lambda x: (x * 2).exp(), (torch.randn(37, 29),))
    src, wrapper = compiled.triton_source, compiled.wrapper_source
    kernel = src[src.index("def kernel0") :]
    assert "37" not in kernel and "29" not in kernel, kernel
    assert "mask=xmask" in kernel  # the extent is symbolic: masked
    # the symbols are read from the input, and the grid is an expression over them
    assert ".size(0)" in wrapper and "//" in wrapper.split("kernel0[", 1)[1].split("]", 1)[0]


@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_and_log_softmax_over_a_symbolic_dim(dim):
    def f(x):
        return torch.softmax(x, dim), torch.log_softmax(x * 3, dim)

    _run_sizes(f, lambda n: (torch.randn(n + 1, 2 * n + 1),))


def test_rows_longer_than_the_first_hint_take_the_looped_twin():
    """Rows of 11 first: a persistent kernel of RBLOCK 16; rows of up to 600 later are reduced
    by its looped twin, which the wrapper picks per call."""

    def f(x, w):
        return x.softmax(-1), F.layer_norm(x, (x.shape[-1],), w, w), x.amax(-1)

    compiled = _run_sizes(
        f,
        lambda n: (torch.randn(3, n), torch.randn(n)),
        sizes=(11, 1, 16, 17, 40, 600),
        first=11,
        dynamic={0: (1,), 1: (0,)},
    )
    assert "_looped[" in compiled.wrapper_source and "<= 16:" in compiled.wrapper_source


def test_layer_norm_mean_var_sum_and_argmax():
    def f(x, w, b):
        y = F.layer_norm(x, (x.shape[-1],), w, b)
        return y, x.sum(1), x.mean(0), x.var(1), x.amax(-1), x.argmax(1), x.sum()

    _run_sizes(f, lambda n: (torch.randn(3, n, n + 4), torch.randn(n + 4), torch.randn(n + 4)))


def test_column_sums_and_transposes_over_symbolic_rows():
    """Sums across rows (a bias gradient) and transposed copies of a [rows, 96] tensor whose
    row count is symbolic: no split partials and no tiles over a symbolic extent, still one
    build."""

    def f(x):
        return x.sum(0), (x * x).sum(0), x.t().contiguous() * 2

    _run_sizes(f, lambda n: (torch.randn(30 * n + 1, 96),), dynamic={0: (0,)}, first=40)


def test_matmul_with_a_fused_epilogue():
    def f(x, w, b):
        return F.gelu(x @ w + b), torch.relu(torch.addmm(b, x, w)) * 2

    _run_sizes(f, lambda n: (torch.randn(n, 24), torch.randn(24, 40), torch.randn(40)))


def test_half_types_round_as_at_static_sizes():
    def f(x):
        return x.float().softmax(-1).to(torch.bfloat16), x * 3 + 1

    _run_sizes(f, lambda n: (torch.randn(n, n + 3).to(torch.bfloat16),))


def test_integer_inputs_bind_symbols():
    def f(x, n):
        return x[:, :n] * n, x.sum(1) + n

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(3, 9), 4)
    compiled = compile_graph_strict(gm, [torch.randn(3, 9), 4], "cuda")
    for m, n in [(9, 4), (5, 1), (30, 17)]:
        _compare(compiled, f, (torch.randn(3, m), n))


def _block(x, wqkv, wo, w1, w2, g1, g2):
    b, t, c = x.shape
    h = F.layer_norm(x, (c,), g1)
    q, k, v = (h @ wqkv).split(c, -1)
    q = q.view(b, t, 2, c // 2).transpose(1, 2)
    k = k.view(b, t, 2, c // 2).transpose(1, 2)
    v = v.view(b, t, 2, c // 2).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(c // 2)
    i = torch.arange(t)
    att = att.masked_fill(i[None, :] > i[:, None], float("-inf"))
    y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
    x = x + y @ wo
    return x + F.gelu(F.layer_norm(x, (c,), g2) @ w1) @ w2


def test_transformer_block_forward_at_many_lengths():
    c = 16

    def make(t):
        ws = [torch.randn(c, 3 * c) / 4, torch.randn(c, c) / 4, torch.randn(c, 4 * c) / 4]
        ws += [torch.randn(4 * c, c) / 8, torch.randn(c), torch.randn(c)]
        return (torch.randn(2, t, c), *ws)

    # the sequence length symbolic, as AOT autograd traces it; the attention rows (length t)
    # outgrow the first length's persistent block
    _run_sizes(_block, make, sizes=(1, 2, 7, 9, 31, 64), dynamic={0: (1,)})


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(24)
        self.fc1, self.fc2 = torch.nn.Linear(24, 48), torch.nn.Linear(48, 24)

    def forward(self, x):
        return (x + self.fc2(F.gelu(self.fc1(self.norm(x))))).softmax(-1)


def test_kiln_compile_dynamic_builds_once_for_every_batch_size():
    """kiln.compile(dynamic=True) for the cuda code generator (on CPU tensors, interpreted):
    forward and backward compile once for all sizes past the first two (capture tells sizes 1
    and 2 apart), gradients included."""
    torch.manual_seed(0)
    model = _MLP()
    compiled = kiln.compile(model, dynamic=True, options={"codegen.device": "cuda"})
    before = None
    for n in (3, 5, 17, 33, 2, 64, 9):
        x = torch.randn(n, 24, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        out, expected = compiled(x), model(x_ref)
        assert_matches_eager(out, expected)
        grad = torch.randn_like(out)
        gs = torch.autograd.grad(out, [x, *model.parameters()], grad)
        es = torch.autograd.grad(expected, [x_ref, *model.parameters()], grad)
        for g, e in zip(gs, es):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
        if before is None:
            before = _builds()  # the forward and backward of the first size
    assert _builds() == before, "one build serves every later size"


def test_sizes_past_32_bit_indices_stop_with_the_reason(monkeypatch):
    """Kernels index with 32 bits when the sizes first seen allow it; a later call whose sizes
    would overflow them stops with the reason and the fix (the limit lowered here to 1000
    elements, as a test cannot allocate 2**31)."""
    from kiln.codegen.triton import load

    monkeypatch.setattr(load, "INDEX_LIMIT", 1000)

    def f(x):
        return x * 2 + 1

    compiled = _compile(f, (torch.randn(5, 7),))
    _compare(compiled, f, (torch.randn(100, 7),))
    with pytest.raises(RuntimeError, match="32-bit indices"):
        compiled(torch.randn(200, 7))
