"""One compile serves every size: graphs traced with symbolic sizes (`make_fx(tracing_mode=
"symbolic")`) compile once on the CPU — one C++ build, kernels taking sizes as arguments, a
wrapper binding the size symbols from the inputs each call — and match eager on fresh random
inputs at many sizes: 1, odd ones, ones no vector width divides, and ones large enough for the
kernels' parallel paths.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from cg_helpers import trace_dynamic
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen import Declined, compile_graph, compile_graph_strict
from kiln.devices import DEVICES
from kiln.runtime import cpp_builder

SIZES = (1, 2, 3, 7, 16, 17, 33, 100)


def _builds() -> int:
    s = cpp_builder.STATS
    return s["compiles"] + s["memory_hits"] + s["disk_hits"]


def _compile(fn, example, dynamic=None):
    gm = trace_dynamic(fn, example, dynamic)
    before = _builds()
    compiled = compile_graph_strict(gm, example)
    assert _builds() - before == 1, "one build for the graph"
    return compiled


def _compare(compiled, fn, args, rtol=1e-4, atol=1e-4):
    expected = fn(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = compiled(*args)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if isinstance(e, torch.Tensor):
            assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, e.shape)
            torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True)
        else:
            assert g == e, (g, e)


def _run_sizes(fn, make, sizes=SIZES, dynamic=None, **tol):
    """Compile `fn` once at the first example, then call it at every size of `sizes` with
    fresh random inputs; no build happens after the first."""
    compiled = _compile(fn, make(5), dynamic)
    before = _builds()
    for n in sizes:
        _compare(compiled, fn, make(n), **tol)
    assert _builds() == before, "no build after the first"
    return compiled


def test_pointwise_chain_with_broadcasting():
    def f(x, y, z):
        return torch.sigmoid(x * y + z).relu() - x / (1 + y.abs())

    _run_sizes(f, lambda n: (torch.randn(n + 2, n), torch.randn(n), torch.randn(n + 2, 1)))


def test_sizes_are_kernel_arguments_not_constants():
    compiled = _compile(lambda x: (x * 2).exp(), (torch.randn(37, 29),))
    kernels = compiled.kernel_source.split('extern "C" void', 1)[1]  # after the prelude
    assert "const int64_t s" in kernels
    assert "37" not in kernels and "29" not in kernels


@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_and_log_softmax_over_a_symbolic_dim(dim):
    def f(x):
        return torch.softmax(x, dim), torch.log_softmax(x * 3, dim)

    _run_sizes(f, lambda n: (torch.randn(n + 1, 2 * n + 1),))


def test_layer_norm_mean_var_sum_and_argmax():
    def f(x, w, b):
        y = F.layer_norm(x, (x.shape[-1],), w, b)
        return y, x.sum(1), x.mean(0), x.var(1), x.amax(-1), x.argmax(1), x.sum()

    _run_sizes(
        f,
        lambda n: (torch.randn(3, n, n + 4), torch.randn(n + 4), torch.randn(n + 4)),
        atol=1e-3,
        rtol=1e-3,
    )


def test_large_sizes_take_the_parallel_paths():
    def f(x):
        return torch.softmax(x, -1) + 1, (x * x).sum(0), x.t().contiguous()

    _run_sizes(f, lambda n: (torch.randn(n * 40, 8 * n + 1),), sizes=(1, 25, 60), atol=1e-3)


def test_views_reshape_permute_cat_slice_select_expand():
    def f(x):
        b, t, c = x.shape
        y = x.reshape(b * t, c).t() * 2
        z = x.permute(2, 0, 1)[1:, :, : t - 1]
        w = torch.cat([x, x[:, :1] * 3], 1)
        v = x[:, 0].unsqueeze(1).expand(b, t, c) + x
        return y, z, w, x.select(2, -1), v, x.flatten(1)[:, 2:]

    _run_sizes(f, lambda n: (torch.randn(2, n + 1, n + 3),))


def test_matmul_addmm_bmm_are_extern_calls():
    def f(x, w, b, q):
        h = torch.addmm(b, x.reshape(-1, x.shape[-1]), w).relu()
        return h, torch.bmm(q, q.transpose(1, 2)), x @ w

    def make(n):
        return (torch.randn(2, n, 8), torch.randn(8, 6), torch.randn(6), torch.randn(3, n, 4))

    _run_sizes(f, make)


def test_integer_inputs_bind_symbols():
    def f(x, n):
        return x[:, :n] * n, x.sum(1) + n

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(3, 9), 4)
    compiled = compile_graph_strict(gm, [torch.randn(3, 9), 4])
    for m, n in [(9, 4), (5, 1), (30, 17)]:
        x = torch.randn(3, m)
        _compare(compiled, f, (x, n))


def _block(x, wqkv, wo, w1, w2, g1, g2):
    b, t, c = x.shape
    h = F.layer_norm(x, (c,), g1)
    q, k, v = (h @ wqkv).split(c, -1)
    heads = 2
    q = q.view(b, t, heads, c // heads).transpose(1, 2)
    k = k.view(b, t, heads, c // heads).transpose(1, 2)
    v = v.view(b, t, heads, c // heads).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(c // heads)
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

    # every size symbolic (weights too: c // heads is a FloorDiv the reshape cannot prove, so
    # those views stay ATen calls), then only the sequence length, as AOT autograd traces it
    _run_sizes(_block, make, sizes=(1, 2, 7, 9, 31, 64), atol=1e-3, rtol=1e-3)
    compiled = _run_sizes(
        _block, make, sizes=(1, 2, 7, 9, 31, 64, 100), dynamic={0: (1,)}, atol=1e-3, rtol=1e-3
    )
    externs = {str(n.target) for n in compiled.schedule.graph.nodes if hasattr(n, "target")}
    assert externs == {"aten.mm.default", "aten.bmm.default"}, externs


def test_a_device_without_symbolic_kernels_declines_with_the_reason():
    cpu = DEVICES["cpu"]
    caps = dataclasses.replace(cpu.capabilities, symbolic_sizes=False)
    static_only = dataclasses.replace(cpu, capabilities=caps)
    gm = make_fx(lambda x: x + 1, tracing_mode="symbolic")(torch.randn(4, 3))
    out = compile_graph(gm, [torch.randn(4, 3)], static_only)
    assert isinstance(out, Declined) and "static sizes only" in out.reason


def test_intermediates_live_in_an_arena_that_grows_with_the_sizes():
    def f(x, w):
        h = torch.softmax(x @ w, -1)
        return (h * x.sum(-1, keepdim=True)).cumsum(1) + torch.tanh(h)

    def make(n):
        return (torch.randn(3, n, 24), torch.randn(24, 24))

    compiled = _compile(f, make(5), dynamic={0: (1,)})
    assert compiled.schedule.arena.grows and "_new_arena(ao_bytes" in compiled.wrapper_source
    kept = compiled._fn.__globals__["_arenas"]  # the wrapper's blocks between calls
    held = []
    for n in (4, 300, 2, 301, 57, 1):  # grow, shrink (the larger block serves), grow again
        _compare(compiled, f, make(n), atol=1e-3)
        (block,) = kept
        held.append(block.numel())
    assert held[1] > held[0] and held[2] == held[1]  # grown once, then kept


def _gathers(idx, wte, x):
    e = F.embedding(idx, wte)
    g = torch.gather(x, 1, idx.clamp(0, x.shape[1] - 1))
    p = F.pad(x, (1, 2)) * 2
    z = torch.zeros(idx.shape[0], idx.shape[1] + 1) + torch.arange(idx.shape[1] + 1)
    m = torch.where(x > 0, x, torch.full_like(x, 0.5))
    return e, g, p, z, m, x.unsqueeze(0).expand(3, -1, -1).contiguous()


def test_embedding_gather_pad_and_creation_ops_lower_with_symbolic_sizes():
    def make(n):
        return (torch.randint(0, 10, (3, n)), torch.randn(10, 8), torch.randn(3, n + 2))

    compiled = _run_sizes(_gathers, make)
    fallbacks = [n for n in compiled.schedule.graph.nodes if hasattr(n, "target")]
    assert all(str(n.target).startswith("kiln.") for n in fallbacks), fallbacks  # checks only
    bad = make(6)
    bad[0][1, 2] = 10  # one row past the embedding table: raises as eager does
    with pytest.raises(IndexError):
        _gathers(*bad)
    with pytest.raises(IndexError):
        compiled(*bad)
