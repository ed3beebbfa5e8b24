"""The Triton path on a real GPU: CUDA tensors through `kiln.codegen.compile_graph` and
`kiln.compile`, compared with eager. Marked `gpu` (deselected by default); run on the GPU
machine with

    PYTHONPATH=src python3 -m pytest -m gpu tests/codegen/triton

(conftest.py leaves `TRITON_INTERPRET` unset for such a run, so kernels are compiled for the
GPU). Each test skips, saying why, without CUDA or Triton.
"""

from __future__ import annotations

import os
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from tr_helpers import check, kernel_count, require_gpu

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _gpu():
    require_gpu()


def cuda(*shape, dtype=torch.float32):
    return torch.randn(*shape, device="cuda").to(dtype)


def test_registry_sends_cuda_graphs_to_triton():
    from kiln.codegen import CompiledGraph, compile_graph

    def fn(x, y):
        return (torch.relu(x * y + 1).exp(),)

    x, y = cuda(1000), cuda(1000)
    compiled = compile_graph(make_fx(fn)(x, y), [x, y])
    assert isinstance(compiled, CompiledGraph)
    assert (compiled.device, compiled.kernel_language) == ("cuda", "Triton")
    out = compiled(x, y)
    assert out[0].device.type == "cuda"
    torch.testing.assert_close(out[0], fn(x, y)[0])


def test_pointwise_chain_one_kernel_large():
    def fn(x, y):
        return (((x * y + 1.5).sin() * 2 - y).exp().sqrt(),)

    c = check(fn, cuda(1 << 22), cuda(1 << 22))
    assert kernel_count(c) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_softmax_layer_norm(dtype):
    # In half types a few layer-norm outputs differ from eager by a half-type ulp of the
    # softmax value (one float32 ulp of `exp(x - max) * (1 / sum)` moves a rounding tie) over
    # the row's standard deviation; `check` then requires kiln's error against float64 to be
    # no worse than eager's (tr_helpers module doc).
    def fn(x, w, b):
        s = torch.softmax(x, -1)
        return s, F.layer_norm(s, (x.shape[-1],), w, b), torch.log_softmax(x, 0)

    check(fn, cuda(512, 2048, dtype=dtype), cuda(2048, dtype=dtype), cuda(2048, dtype=dtype))
    check(fn, cuda(8, 10000, dtype=dtype), cuda(10000, dtype=dtype), cuda(10000, dtype=dtype))


def test_reductions_and_integers():
    def fn(x, i):
        return (
            x.sum(),
            x.sum(0),
            x.amax(1),
            x.argmax(1),
            x.var(1),
            (i * 3 // 2).sum(1),
            torch.remainder(i, 7),
            (x > 0).any(1),
        )

    # x.sum() adds 77,100 terms and cancels to ~10: any order is good to about eps * sum|x|
    # (the helper's module doc); a lost or doubled term moves it by ~1, far beyond that.
    check(
        fn,
        cuda(300, 257),
        torch.randint(-100, 100, (300, 257), device="cuda"),
        scales=lambda x, i: {0: x.abs().sum().item()},
    )


def test_transposes_and_views():
    def fn(x):
        return x.t() * 2, x.permute(1, 0).contiguous() + 1, x[::2, 1:].exp(), x.reshape(-1, 64)

    check(fn, cuda(1024, 768))


def test_math_through_libdevice():
    def fn(x):
        return torch.expm1(x), torch.lgamma(x.abs() + 1), torch.atan2(x, x + 1), x.round()

    check(fn, cuda(4096))


def test_matmul_extern_with_epilogue_bf16():
    def fn(a, b, bias):
        return (F.gelu(a @ b + bias),)

    check(
        fn,
        cuda(256, 512, dtype=torch.bfloat16),
        cuda(512, 128, dtype=torch.bfloat16),
        cuda(128, dtype=torch.bfloat16),
    )


def test_parallel_compile_warms_kernels():
    from kiln.runtime import triton_builder

    def fn(x, y):
        a = torch.softmax(x, -1)
        b = ((x.t() + 1) * 3).contiguous()  # a transpose: its own (tiled) kernel
        c = (y.sum(0) + 1).exp()
        d = F.layer_norm(x, (x.shape[1],))
        return a, b, c, d

    def scales(x, y):
        # exp of a float32 sum: the sum is known to eps * sum|y| in any order, and exp
        # multiplies that error by its own value (the module doc of tr_helpers: `scales=`)
        return {2: (torch.exp(y.sum(0) + 1) * y.abs().sum(0)).max().item()}

    before = triton_builder.STATS["warmed"]
    c = check(fn, cuda(128, 96), cuda(64, 33), scales=scales)
    assert kernel_count(c) >= triton_builder.PARALLEL_MIN_KERNELS
    assert triton_builder.STATS["warmed"] > before


def test_first_launches_only_load_what_the_workers_compiled(tmp_path, monkeypatch):
    """The workers compile each kernel for the launch Triton will make (its specialization)
    and build its C launcher; the parent loads each binary by the hash its worker reports
    (no `triton.compile` call at all) and finds the launchers in Triton's cache: no kernel
    compiled and no gcc run in this process."""
    import triton
    import triton.runtime.build as build

    from kiln.runtime import triton_builder

    triton_builder.shutdown()  # new workers, which see the cache folder below
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    hits, builds = [], []
    monkeypatch.setattr(
        triton.knobs.compilation, "listener", lambda **kw: hits.append(kw["cache_hit"])
    )
    real_build = build._build
    monkeypatch.setattr(
        build, "_build", lambda *a, **kw: builds.append(a[0]) or real_build(*a, **kw)
    )

    def fn(x, y):
        return torch.softmax(x * 3, -1), (y.t() - 2).contiguous(), x.sum(1) * y[0, 0]

    before = dict(triton_builder.STATS)
    c = check(fn, cuda(77, 211), cuda(61, 19))
    assert triton_builder.STATS["warmed"] - before["warmed"] == kernel_count(c) >= 2
    assert triton_builder.STATS["preloaded"] - before["preloaded"] == kernel_count(c)
    assert hits == []  # no launch went to Triton's compile, not even for a cache hit
    assert builds == []  # and every launcher was in the cache


def test_a_cold_compile_never_hashes_triton_in_the_parent(run_python, tmp_path):
    """Triton's cache key hashes its own files (`triton_key`, about 0.4 s: libtriton is 400 MB).
    The workers compute it; a fresh process that compiles and runs a graph of several kernels
    loads them by hash and never computes it. The results match eager."""
    probe = textwrap.dedent(
        """
        import torch
        import kiln
        from triton.runtime.cache import triton_key
        from kiln.runtime import triton_builder

        def fn(x, y):
            return torch.softmax(x * 3, -1), (y.t() - 2).contiguous(), x.sum(1) * y[0, 0]

        x, y = torch.randn(77, 211, device="cuda"), torch.randn(61, 19, device="cuda")
        got, want = kiln.compile(fn)(x, y), fn(x, y)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        print(triton_builder.STATS["preloaded"], triton_key.cache_info().misses)
        """
    )
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "t"), KILN_CACHE_DIR=str(tmp_path / "k"))
    env.pop("TRITON_INTERPRET", None)
    preloaded, hashed = run_python("-c", probe, env=env).stdout.split()[-2:]
    assert int(preloaded) >= 2
    assert hashed == "0"


def test_kiln_compile_module_on_cuda():
    import kiln

    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128), torch.nn.Linear(128, 8)
    ).cuda()
    compiled = kiln.compile(model)
    x = cuda(32, 64)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def test_launches_after_the_first_skip_tritons_dispatch(monkeypatch):
    from triton.runtime.jit import JITFunction

    def fn(x, y):
        return (torch.sin(x) * y + 1,)

    x, y = cuda(4096), cuda(4096)
    c = check(fn, x, y, fresh=False)  # the first launch: through Triton, compiles
    slow = []
    real = JITFunction.run
    monkeypatch.setattr(
        JITFunction, "run", lambda self, *a, **k: slow.append(1) or real(self, *a, **k)
    )
    for _ in range(3):
        x, y = cuda(4096), cuda(4096)
        torch.testing.assert_close(c(x, y)[0], fn(x, y)[0])
    assert slow == []  # the compiled kernel's launcher was called directly
    base = cuda(4097)
    x = base[1:]  # 4 bytes past an aligned address: the kernel compiled for aligned pointers
    torch.testing.assert_close(c(x, y)[0], fn(x, y)[0])
    assert slow  # ... so this launch went through Triton, which picks the matching variant


def test_language_model_head_is_computed_at_an_aligned_width():
    # GPT-2's 50257-word head: cuBLAS's unaligned kernel took 3.3 ms at 4096 rows on the H200
    def fn(x, w):
        return (x @ w.t(),)

    x, w = cuda(512, 768, dtype=torch.bfloat16), cuda(50257, 768, dtype=torch.bfloat16)
    c = check(fn, x, w)
    assert "aten_constant_pad_nd" not in c.wrapper_source  # the padding is a kiln kernel
    assert "(512, 50257), (50264, 1)" in c.wrapper_source  # the narrow view of the product


def test_guards_see_a_tensor_move_between_devices():
    """Capture's tensor guard compares a CUDA tensor's device index (not a `torch.device`):
    the same function called on the GPU, the CPU and the GPU again recompiles for each and
    returns each result on its input's device."""
    import kiln

    def f(x):
        return x * 2 + 1

    compiled = kiln.compile(f)
    for device in ("cuda", "cpu", "cuda"):
        x = torch.randn(64, device=device)
        out = compiled(x)
        assert out.device == x.device
        torch.testing.assert_close(out, f(x))


def test_bf16_results_round_exactly_as_eager():
    """The hardware conversion (ops.BF16_COMPILED) gives eager's bits: each op computed in
    float32 and rounded once to bfloat16, as ATen does, over 65536 random values."""

    def fn(x, y):
        return (x * y, x + y, (x.to(torch.float32) * 1.37).to(torch.bfloat16))

    x = (cuda(1 << 16) * 30).to(torch.bfloat16)
    y = cuda(1 << 16).to(torch.bfloat16)
    c = check(fn, x, y)
    assert "0x7FFF" not in c.triton_source  # compiled for the GPU: the hardware conversion
    for got, want in zip(c(x, y), fn(x, y)):
        assert torch.equal(got, want)


def test_split_column_sums_on_the_gpu():
    """A layer norm backward's column sums over 8192 x 768 split their rows among programs
    (two launches) and match eager, judged against float64 by the sums' own error scale."""

    def fn(g, x, m, r):
        return ((g * ((x - m[:, None]) * r[:, None])).sum(0), g.sum(0), x.sum(0))

    def scales(g, x, m, r):
        norm = (x - m[:, None]) * r[:, None]
        return {0: (g * norm).abs().sum(0).max(), 1: g.abs().sum(0).max(), 2: x.abs().sum(0).max()}

    args = (cuda(8192, 768), cuda(8192, 768), cuda(8192), cuda(8192).abs())
    c = check(fn, *args, scales=scales)
    assert "kernel0_sum[" in c.wrapper_source and "_part = _empty(" in c.wrapper_source


def test_attention_training_step_never_waits_for_the_gpu():
    """Memory-efficient attention returns its random seed and offset as CPU tensors and its
    backward takes them back: the backward's wrapper leaves them on the CPU (a copy to the GPU
    made every step wait for the GPU to drain). The whole step runs with no synchronization,
    and its gradients match eager's."""
    import kiln

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(64, 192)

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 128, 3, 4, 16).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()

    torch.manual_seed(0)
    model = Attn().cuda()
    compiled = kiln.compile(model)
    x = cuda(2, 128, 64)
    for _ in range(2):  # compile, then warm the allocator
        model.zero_grad(set_to_none=True)
        compiled(x).backward()
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        compiled(x).backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    model(x).backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, atol=1e-4, rtol=1e-4)


def test_a_mask_that_masks_nothing_leaves_attention_on_a_fused_kernel():
    """transformers under a compiler gives BERT an all-true mask built from `arange`; kiln
    drops it, so SDPA takes a fused kernel (eager BERT, given no mask, takes cuDNN's) instead
    of the math path's float32 products and softmax. Outputs match eager."""
    import kiln
    from kiln.autograd import aot_compile
    from kiln.autograd.backend import eager_graph

    def attention(q, k, v):
        n = q.shape[-2]
        mask = (torch.arange(n, device=q.device)[None, None, :, None] >= 0).expand(
            q.shape[0], -1, n, n
        )
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125)

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return eager_graph(gm, example_inputs)

    def backend(gm, example_inputs):
        return aot_compile(gm, example_inputs, fw_compiler=record, bw_compiler=record)

    # BERT-base's attention at 16 x 256, heads split from one projection as transformers does
    x = [cuda(16, 256, 768, dtype=torch.bfloat16) for _ in range(3)]
    q, k, v = (t.view(16, 256, 12, 64).transpose(1, 2) for t in x)
    with torch.no_grad():
        kiln.compile(attention, backend=backend)(q, k, v)
        targets = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
        fused = [t for t in targets if t.startswith("aten._scaled_dot_product_")]
        assert fused and not any("math" in t for t in fused), sorted(targets)
        out = kiln.compile(lambda *qkv: attention(*qkv))(q, k, v)  # the builtin backend
    torch.testing.assert_close(out, attention(q, k, v), atol=2e-2, rtol=2e-2)


def test_convolutions_read_channels_last_on_the_gpu():
    """An NCHW convolution network gets channels-last convolution inputs (cuDNN's bfloat16
    convolutions run NHWC and otherwise transpose in and out around every call); the rewrite
    runs on the real device's metadata, and the graph stays on Triton."""
    from kiln.autograd.decomps import default_decompositions
    from kiln.codegen import compile_graph_strict

    torch.manual_seed(0)
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(16, 32, 3, padding=1, bias=False),
        torch.nn.BatchNorm2d(32),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1),
    )
    conv = conv.cuda().to(torch.bfloat16).eval()

    def fn(x):  # pooled, as a classifier's head reads it: the output's layout is eager's
        return (conv(x).relu().mean((2, 3)),)

    x = cuda(8, 16, 32, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=default_decompositions())(x)
        compiled = compile_graph_strict(gm, [x])
        assert compiled.kernel_language == "Triton"
        convs = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
        assert convs and all(
            c.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last) for c in convs
        )
        fresh = cuda(8, 16, 32, 32, dtype=torch.bfloat16)
        (out,) = compiled(fresh)
        torch.testing.assert_close(out, fn(fresh)[0], atol=5e-2, rtol=2e-2)
