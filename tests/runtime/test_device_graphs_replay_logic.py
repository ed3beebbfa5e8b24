"""The replay bookkeeping of device graphs (runtime/device_graphs.py) on the CPU, through a
stand-in implementation that behaves like a device graph: capture runs the callable once and
keeps its outputs as the static output buffers; a replay runs it again on the same static input
buffers and writes the results into those outputs. What is tested here is kiln's side (which
inputs are copied, which are read in place, which signature selects a graph), not CUDA's; the
same behaviours run on the GPU in test_device_graphs.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kiln import devices
from kiln.runtime import device_graphs as dg

_COPY = torch.Tensor.copy_  # the stand-in's own writes, not counted where copy_ is watched


class ReplayingGraphs(dg.DeviceGraphs):
    def __init__(self):
        self.captures = 0
        self.replays = 0

    def new_pool(self):
        return None

    def warmup(self, run):
        return run()

    def capture(self, run, pool):
        self.captures += 1
        outs = run()
        return (run, outs), outs

    def replay(self, graph):
        self.replays += 1
        run, outs = graph
        for static, new in zip(outs, run()):
            _COPY(static, new)


@pytest.fixture
def device(monkeypatch):
    """The cpu device, given the stand-in as its graph runner (kiln.devices)."""
    impl = ReplayingGraphs()
    cpu = dataclasses.replace(devices.DEVICES["cpu"], graph_runner=impl)
    monkeypatch.setitem(devices.DEVICES, "cpu", cpu)
    return impl


def _step(tokens, pos, cache_k, cache_v, w):
    """A decode-like step: four inputs copied into static buffers, one read in place."""
    h = w[tokens.view(-1)] + pos
    return (h @ cache_k.sum(0) + cache_v.mean(), h.relu())


def _inputs():
    return [
        torch.randint(0, 16, (1, 1)),
        torch.randn(1, 1),
        torch.randn(3, 8, 5),
        torch.randn(3, 8, 5),
    ]


def test_replays_see_every_copied_input_and_the_static_one_in_place(device):
    w = torch.nn.Parameter(torch.randn(16, 8), requires_grad=False)
    g = dg.graphed(_step, static_inputs=())
    for k in range(6):
        args = _inputs()
        if k == 4:  # the static input changes in place: the graph reads it where it is
            with torch.no_grad():
                w.mul_(2)
        got = g([*args, w])
        want = _step(*args, w)
        for a, b in zip(got, want):
            torch.testing.assert_close(a.clone(), b)
    assert device.captures == 1 and len(g.recorded) == 1
    (rec,) = g.recorded.values()
    assert rec.copied == [0, 1, 2, 3]  # the parameter at position 4 is never copied
    assert rec.static_inputs[4].data_ptr() == w.data_ptr()


def test_a_static_input_at_a_new_address_records_another_graph(device):
    w = torch.nn.Parameter(torch.randn(16, 8), requires_grad=False)
    g = dg.graphed(_step)
    args = _inputs()
    for _ in range(3):
        g([*args, w])
    w.data = torch.randn(16, 8)  # same Parameter object, new storage
    for _ in range(3):
        args = _inputs()
        got = g([*args, w])
        for a, b in zip(got, _step(*args, w)):
            torch.testing.assert_close(a.clone(), b)
    assert len(g.recorded) == 2


def test_named_static_positions_are_read_in_place(device):
    buf = torch.randn(16, 8)  # a plain tensor, static because the caller says so
    g = dg.graphed(_step, static_inputs=(4,))
    for _ in range(4):
        args = _inputs()
        buf.normal_()
        got = g([*args, buf])
        for a, b in zip(got, _step(*args, buf)):
            torch.testing.assert_close(a.clone(), b)
    (rec,) = g.recorded.values()
    assert 4 not in rec.copied


def test_an_input_already_in_its_static_buffer_is_not_copied(device, monkeypatch):
    g = dg.graphed(lambda x, y: (x * 2 + y,))
    for _ in range(3):
        g([torch.randn(4), torch.randn(4)])
    (rec,) = g.recorded.values()
    copies = []
    real = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda s, o: copies.append(1) or real(s, o))
    x = rec.static_inputs[0]
    x.normal_()
    y = torch.randn(4)
    (out,) = g([x, y])
    torch.testing.assert_close(out.clone(), x * 2 + y)
    assert len(copies) == 1  # y only; x already lives in its buffer


def test_another_layout_records_another_graph(device):
    g = dg.graphed(lambda x: (x.sum(0),))
    a = torch.randn(4, 6)
    for _ in range(3):
        g([a])
    for _ in range(3):
        b = torch.randn(6, 4).t()  # same shape, other strides
        (out,) = g([b])
        torch.testing.assert_close(out.clone(), b.sum(0))
    assert len(g.recorded) == 2
