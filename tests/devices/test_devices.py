"""The device interface (kiln.devices) and the one pipeline (codegen/pipeline.py).

A third-party device registers through the public `kiln.register_device` and compiles a real
model: here a toy device that reuses the CPU's C++ renderer under another name, with its own
capabilities (no indirect loads) and rewrite list. nanoGPT runs through it, forward and a
training step, compared with eager on fresh random data; a recorder checks that every graph
really was compiled by the toy device, not by the built-in cpu one.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln import devices
from kiln.bench import suite
from kiln.codegen import CompiledGraph, Declined, compile_graph
from kiln.codegen.cpp.device import CPP
from kiln.lower.ir import Extern


class ToyCodeGen:
    """The C++ code generator under another name, counting what it builds."""

    kernel_language = "C++ (toy)"

    def __init__(self):
        self.built = 0

    def unavailable(self):
        return CPP.unavailable()

    def start(self, options):
        pass

    def render(self, sched, options):
        return CPP.render(sched, options)

    def wrap(self, sched, kernels, checked_inputs, capabilities):
        return CPP.wrap(sched, kernels, checked_inputs, capabilities)

    def build(self, kernels, wrapper, sched, example_inputs):
        self.built += 1
        return CPP.build(kernels, wrapper, sched, example_inputs)


@pytest.fixture
def toy():
    gen = ToyCodeGen()
    device = devices.Device(
        name="toy",
        tensor_type="cpu",
        capabilities=devices.Capabilities(indirect_loads=False),
        rewrites=("functionalize_restrides", "fake_metadata", "merge_repeats"),
        codegen=gen,
        description="the C++ renderer under another name",
    )
    kiln.register_device("toy", device)
    kiln.reset()
    yield gen
    devices.unregister_device("toy")
    kiln.reset()


@pytest.fixture
def compiled_graphs(monkeypatch):
    made: list = []
    real = kiln.codegen.compile_graph

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        made.append(out)
        return out

    monkeypatch.setattr(kiln.codegen, "compile_graph", recording)
    return made


def _nanogpt(seed: int):
    bench = suite.load_models(suite.models_dir())["nanogpt"]
    model, _ = bench.factory("cpu", torch.float32, "small", seed=seed)
    return bench, model


def test_a_toy_device_compiles_nanogpt_forward_and_training(toy, compiled_graphs):
    bench, model = _nanogpt(seed=5)
    model.train()
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"codegen.device": "toy"})
    for seed in range(2):
        (idx,) = bench.inputs("cpu", torch.float32, "small", seed=20 + seed)
        out, out_ref = compiled(idx), ref(idx)
        torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-5)
        target = torch.randint(0, out.shape[-1], out.shape[:2], generator=torch.Generator())
        F.cross_entropy(out.flatten(0, 1), target.flatten()).backward()
        F.cross_entropy(out_ref.flatten(0, 1), target.flatten()).backward()
        for p, p_ref in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
    assert len(compiled_graphs) >= 2  # a forward and a backward
    for g in compiled_graphs:
        assert isinstance(g, CompiledGraph), g
        assert g.device == "toy" and g.kernel_language == "C++ (toy)"
    assert toy.built == len(compiled_graphs)
    # its capabilities were read: without indirect loads the embeddings stay ATen calls
    externs = [n for g in compiled_graphs for n in g.schedule.graph.nodes if isinstance(n, Extern)]
    assert any("no indirect loads" in n.reason for n in externs)


def test_a_toy_device_registered_for_a_tensor_type_is_its_default(toy, compiled_graphs):
    import dataclasses

    cpu = devices.get_device("cpu")
    kiln.register_device("cpu", dataclasses.replace(devices.get_device("toy"), name="cpu"))
    try:
        f = kiln.compile(lambda x: (x.sin() * 2).relu().sum(-1))
        x = torch.randn(8, 16)
        f(x)
        torch.testing.assert_close(f(x2 := torch.randn(8, 16)), (x2.sin() * 2).relu().sum(-1))
    finally:
        kiln.register_device("cpu", cpu)
    assert compiled_graphs and all(g.device == "cpu" for g in compiled_graphs)
    assert toy.built == len(compiled_graphs)


def test_register_device_checks_what_it_is_given():
    toy = devices.Device("x", "cpu", devices.Capabilities(), ("merge_repeats",), codegen=CPP)
    with pytest.raises(TypeError, match="kiln.devices.Device"):
        kiln.register_device("x", "kiln.codegen.cpp.device:CPP")
    with pytest.raises(ValueError, match="differs"):
        kiln.register_device("y", toy)
    with pytest.raises(ValueError, match="not a torch device type"):
        kiln.register_device("x", dataclasses_replace(toy, tensor_type="not_a_device"))
    with pytest.raises(ValueError, match="unknown ATen rewrite"):
        kiln.register_device("x", dataclasses_replace(toy, rewrites=("no_such_pass",)))
    assert "x" not in devices.DEVICES


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def test_a_graph_no_device_takes_is_declined_with_the_reason():
    gm = make_fx(lambda x: (x + 1,))(torch.randn(3))
    with pytest.raises(KeyError, match="no device 'nope'"):
        compile_graph(gm, [torch.randn(3)], "nope")
    saved = devices.DEVICES.pop("cpu")
    try:
        out = compile_graph(gm, [torch.randn(3)])
    finally:
        devices.DEVICES["cpu"] = saved
    assert isinstance(out, Declined)
    assert "no kiln device compiles cpu tensors" in out.reason


def test_a_missing_compiler_is_declined_not_raised(monkeypatch, toy):
    monkeypatch.setattr(toy, "unavailable", lambda: "the toy compiler is not installed")
    gm = make_fx(lambda x: (x * 3,))(torch.randn(3))
    out = compile_graph(gm, [torch.randn(3)], "toy")
    assert isinstance(out, Declined) and out.device == "toy"
    assert out.reason == "the toy compiler is not installed"


def test_declined_reaches_the_fallback_record_whatever_the_logs(toy, monkeypatch):
    from kiln.backends import builtin

    monkeypatch.setattr(toy, "unavailable", lambda: "toy compiler missing, for this test")
    kiln.set_logs()  # nothing on: the reason must still be recorded
    before = len(builtin.fallbacks())
    f = kiln.compile(lambda x: x.cos() + 1, options={"codegen.device": "toy"})
    x = torch.randn(5)
    torch.testing.assert_close(f(x), x.cos() + 1)
    got = builtin.fallbacks()[before:]
    assert len(got) == 1 and "toy compiler missing, for this test" in got[0].reason


def test_passes_log_shows_the_ir_after_each_pass(monkeypatch):
    import logging

    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("kiln.passes").addHandler(handler)
    kiln.set_logs("passes")
    try:
        x = torch.randn(4, 8)
        gm = make_fx(lambda x: ((x + 1).relu().sum(-1) * 2,))(x)
        compiled = compile_graph(gm, [x])
        torch.testing.assert_close(compiled(x)[0], (x + 1).relu().sum(-1) * 2)
    finally:
        kiln.set_logs()
        logging.getLogger("kiln.passes").removeHandler(handler)
    heads = [m.splitlines()[0] for m in said]
    assert heads[0] == "after lower (cpu):"
    assert "after schedule pass inline_pointwise:" in heads
    assert heads[-2:] == ["after render (C++):", "after wrap:"]
    lowered = said[0]
    assert "= pointwise[i0, i1] add(arg0[i0, i1], 1.0:f32)" in lowered
    assert "= sum[i0] over [r0] in [8]" in lowered
