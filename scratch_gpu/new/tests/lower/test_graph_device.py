"""The lowering context knows the graph's device: factories (`full`, `arange`, `scalar_tensor`,
`zeros`, ...) created there lower to kernels; anything whose output is on another device stays
an ATen call (kernels write buffers on the graph's device), and so does an op whose kernel would
read such a tensor.

A CUDA graph is traced with fake CUDA tensors (no GPU needed) and lowered with CPU stand-ins for
its inputs, as codegen/triton does; those tests read the loop IR. CPU graphs are compiled and
compared with eager on fresh random inputs.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen import compile_graph_strict
from kiln.lower import lower_graph
from kiln.lower.graph import graph_device, is_fallback


def _lower_on_fake_cuda(fn, *shapes):
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [torch.empty(s, device="cuda") for s in shapes]
    gm = make_fx(fn, tracing_mode="fake")(*fakes)
    assert graph_device(gm, []) == torch.device("cuda", 0)
    return lower_graph(gm, [torch.empty(s) for s in shapes])


def _externs(graph) -> dict[str, str]:
    return {str(n.target): n.reason for n in graph.nodes if is_fallback(n)}


def _gpt2_mask(x):
    # HF GPT-2's attention: a mask value and positions made on the activations' device
    n = x.shape[-1]
    big_negative = torch.full([], -65504.0, dtype=x.dtype, device=x.device)
    pos = torch.arange(n, device=x.device)
    causal = pos.unsqueeze(1) >= pos.unsqueeze(0)
    scale = torch.ops.aten.scalar_tensor.default(0.125, dtype=x.dtype, device=x.device)
    ones = torch.ones(n, device=x.device) + torch.zeros(n, device=x.device)
    return torch.where(causal, x * scale, big_negative) * ones


def test_factories_on_the_graphs_device_lower_to_kernels():
    graph = _lower_on_fake_cuda(_gpt2_mask, (4, 8, 8))
    assert _externs(graph) == {}, str(graph)


def test_factories_with_a_device_index_lower_when_it_is_the_graphs():
    def fn(x):
        return (x + torch.arange(8, device="cuda:0"), x * torch.full((8,), 2.0, device="cuda"))

    assert _externs(_lower_on_fake_cuda(fn, (8,))) == {}


def test_a_cpu_factory_in_a_cuda_graph_stays_a_call_and_so_do_its_readers():
    def fn(x):
        c = torch.scalar_tensor(2.0)  # on the CPU: eager lets a 0-dim CPU tensor meet CUDA ones
        return (x * c, c + 1, x + 1)

    graph = _lower_on_fake_cuda(fn, (4,))
    externs = _externs(graph)
    # Lowered, `c + 1` would be a kernel writing a GPU buffer: a graph output on the wrong device.
    assert externs["aten.scalar_tensor.default"] == "output on cpu, not the graph's device cuda:0"
    assert externs["aten.add.Tensor"] == "output on cpu, not the graph's device cuda:0"
    # A kernel on the GPU cannot read the CPU scalar; ATen's mul can.
    assert externs["aten.mul.Tensor"].startswith("lowering declined: reads extern")
    assert "a tensor on cpu, in a graph whose kernels run on cuda:0" in externs["aten.mul.Tensor"]
    assert len([n for n in graph.nodes if is_fallback(n)]) == 3  # x + 1 is a kernel


def test_a_factory_on_another_gpu_is_refused_with_the_reason():
    def fn(x):
        return (x + 1, torch.zeros(3, device="cuda:1"))

    externs = _externs(_lower_on_fake_cuda(fn, (4,)))
    assert externs == {"aten.zeros.default": "output on cuda:1, not the graph's device cuda:0"}


def test_copies_to_the_graphs_device_lower_and_copies_off_it_do_not():
    def fn(x):
        return (x.to("cuda:0", torch.float64) * 2, x.to("cpu"))

    externs = _externs(_lower_on_fake_cuda(fn, (4,)))
    assert externs == {"aten._to_copy.default": "output on cpu, not the graph's device cuda:0"}


def test_cpu_factories_in_a_cpu_graph_match_eager():
    def fn(x):
        n = x.shape[-1]
        pos = torch.arange(n, device="cpu")
        causal = pos.unsqueeze(1) >= pos.unsqueeze(0)
        fill = torch.scalar_tensor(-65504.0, device=x.device)
        return (torch.where(causal, x, fill) + torch.full((n,), 0.5, device="cpu"),)

    x = torch.randn(3, 6, 6)
    gm = make_fx(fn)(x)
    graph = lower_graph(gm, [x])
    assert _externs(graph) == {}
    compiled = compile_graph_strict(make_fx(fn)(x), [x])
    for args in ((x,), (torch.randn(3, 6, 6),)):
        torch.testing.assert_close(compiled(*args)[0], fn(*args)[0])
