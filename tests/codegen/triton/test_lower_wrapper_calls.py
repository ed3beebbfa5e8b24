"""What lowering takes out of the Triton wrapper (the Python program that runs a graph, where
every ATen call costs CPU time on each run): splits are views, factories on the graph's device
are kernels, and a value a model computes once per layer is computed once.

Compiled graphs run under Triton's interpreter on the CPU and are compared with eager
(`tr_helpers.check`, fresh random inputs too). A CUDA graph cannot run here, so its test traces
with fake CUDA tensors and reads the wrapper the Triton path renders for it.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from tr_helpers import check, require_interpreter

from kiln.codegen import compile_graph_strict
from kiln.codegen.triton import render_module, render_wrapper
from kiln.devices.builtin import CUDA
from kiln.lower import lower_graph
from kiln.schedule import schedule


@pytest.fixture
def _interpreter():
    require_interpreter()


def _aten_calls(wrapper_source: str) -> list[str]:
    return re.findall(r"= (aten_\w+)\(", wrapper_source)


def _launches(wrapper_source: str) -> int:
    return len(re.findall(r"^\s*kernel\d+\[", wrapper_source, flags=re.M))


def _attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.usefixtures("_interpreter")
def test_gpt2_qkv_split_calls_nothing_and_matches_eager():
    def fn(h, w):
        q, k, v = (h @ w).view(2, 16, 96).split(32, dim=2)
        heads = [t.view(2, 16, 2, 16).transpose(1, 2) for t in (q, k, v)]
        return (_attention(*heads, None), v)

    c = check(fn, torch.randn(32, 32), torch.randn(32, 96))
    assert _aten_calls(c.wrapper_source) == [
        "aten_mm_default",
        "aten__scaled_dot_product_flash_attention_for_cpu_default",
    ]


@pytest.mark.usefixtures("_interpreter")
def test_a_mask_built_in_every_layer_is_one_kernel_and_matches_eager():
    def mask(x):  # each layer builds it from the same input and the same scalars
        pos = torch.arange(x.shape[-2], device=x.device)
        causal = pos.unsqueeze(1) >= pos.unsqueeze(0)
        low = torch.scalar_tensor(-65504.0, dtype=x.dtype, device=x.device)
        return torch.where(causal, torch.zeros((), dtype=x.dtype, device=x.device), low)

    def per_layer(x):
        h = x
        for _ in range(3):
            h = _attention(h, h, h, mask(x)) + h
        return (h,)

    def once(x):
        m = mask(x)
        h = x
        for _ in range(3):
            h = _attention(h, h, h, m) + h
        return (h,)

    x = torch.randn(2, 2, 16, 8)
    c = check(per_layer, x)
    assert _launches(c.wrapper_source) == _launches(check(once, x).wrapper_source) == 4
    masks = re.findall(r"attn_mask=(\w+)", c.wrapper_source)
    assert len(masks) == 3 and len(set(masks)) == 1  # one mask buffer, read by every layer


@pytest.mark.usefixtures("_interpreter")
def test_dropout_twice_gives_two_masks():
    def fn(x):
        return (F.dropout(x, 0.5, training=True), F.dropout(x, 0.5, training=True))

    x = torch.randn(64, 64)
    gm = make_fx(torch.func.functionalize(fn, remove="mutations_and_views"))(x)
    c = compile_graph_strict(gm, [x], "cuda")
    for arg in (x, torch.randn(64, 64)):
        a, b = c(arg)
        for out in (a, b):  # each a dropout of arg: zeros or 2 * arg, both kinds present
            kept = out != 0
            torch.testing.assert_close(out[kept], 2 * arg[kept])
            assert 0 < kept.sum() < out.numel()
        assert not torch.equal(a != 0, b != 0)


@pytest.mark.usefixtures("_interpreter")
def test_minus_zero_and_zero_stay_two_constants():
    for dtype in (torch.float32, torch.float64, torch.bfloat16):

        def fn(x):
            pos, neg = (torch.full((8,), z, dtype=x.dtype) for z in (0.0, -0.0))
            return (x + 1 / pos, x + 1 / neg)

        check(fn, torch.randn(8, dtype=dtype))


def test_factories_on_a_cuda_graphs_device_leave_no_call_in_its_wrapper():
    def fn(x):
        pos = torch.arange(x.shape[-1], device=x.device)
        causal = pos.unsqueeze(1) >= pos.unsqueeze(0)
        low = torch.ops.aten.scalar_tensor.default(-65504.0, dtype=x.dtype, device=x.device)
        masked = torch.where(causal, x, low) + torch.full([], 1.0, device=x.device)
        return (masked, torch.ops.aten.scalar_tensor.default(3.0, device="cpu"))

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(2, 8, 8, device="cuda")
    gm = make_fx(fn, tracing_mode="fake")(x)
    sched = schedule(lower_graph(gm, [x], CUDA.capabilities))
    module = render_module(sched)
    wrapper = render_wrapper(sched, {k.name: k for k in module.kernels}).source
    # the CPU scalar is a graph output: only ATen makes it where eager does
    assert _aten_calls(wrapper) == ["aten_scalar_tensor_default"]
    assert "device=torch.device('cpu')" in wrapper
    assert len(module.kernels) == 1
