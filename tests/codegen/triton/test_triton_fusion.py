"""Fusion, index and mask rendering, the builder's caches and the device registry (Triton).

Fusion is the scheduler's (shared with the C++ path); these tests check that the Triton
renderer keeps its groups: a 6-op pointwise chain is one kernel, softmax and layer norm are
one kernel each and read their input once. Every compiled result is also compared with eager.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from tr_helpers import check, compile_fn, kernel_count, kernel_source, require_interpreter

pytestmark = pytest.mark.usefixtures("_interpreter")


@pytest.fixture
def _interpreter():
    require_interpreter()


def test_six_op_pointwise_chain_is_one_kernel():
    def fn(x, y):
        return (((x * y + 1.5).sin() * 2 - y).exp().sqrt(),)

    c = check(fn, torch.randn(4096), torch.randn(4096))
    assert kernel_count(c) == 1
    assert c.wrapper_source.count("kernel0[") == 1
    src = kernel_source(c, "kernel0")
    # 4096 elements in blocks of 1024: flat, contiguous indices, no masks
    assert "tl.load(arg0 + (xindex))" in src and "mask" not in src


def test_softmax_is_one_kernel_reading_its_input_once():
    def fn(x):
        return (torch.softmax(x, -1),)

    c = check(fn, torch.randn(16, 100))
    assert kernel_count(c) == 1
    src = kernel_source(c, "kernel0")
    assert src.count("tl.load(") == 1
    assert "rmask" in src and "xmask" not in src  # 100 -> RBLOCK 128 overhangs; 16 rows do not


def test_layer_norm_is_one_kernel():
    def fn(x, w, b):
        return (F.layer_norm(x, (64,), w, b),)

    c = check(fn, torch.randn(32, 64), torch.randn(64), torch.randn(64))
    assert kernel_count(c) == 1
    assert "mask" not in kernel_source(c, "kernel0")  # 64 columns fill RBLOCK exactly


def test_decode_shaped_residual_and_layer_norm_fuse():
    def fn(x, y, w, b):  # rows of [1, 1, C]: the statistics [1, 1] are the row's own
        h = x + y
        return h, F.layer_norm(h, (64,), w, b)

    c = check(fn, torch.randn(1, 1, 64), torch.randn(1, 1, 64), torch.randn(64), torch.randn(64))
    assert kernel_count(c) == 1


def test_softmax_then_layer_norm_fuse():
    def fn(x, w, b):
        return (F.layer_norm(torch.softmax(x, -1), (48,), w, b),)

    c = check(fn, torch.randn(10, 48), torch.randn(48), torch.randn(48))
    assert kernel_count(c) == 1


def test_broadcast_index_is_simplified():
    def fn(x, b):
        return (x + b,)

    c = check(fn, torch.randn(8, 4, 64), torch.randn(64))
    src = kernel_source(c, "kernel0")
    assert "tl.load(arg1 + (xindex % 64))" in src or "tl.load(arg1 + ((xindex % 64)))" in src


def test_looped_member_values_are_recomputed_not_reread():
    def fn(x):
        y = x * 2 + 1
        return (y, y.sum(1))

    c = check(fn, torch.randn(2, 6000))
    src = kernel_source(c, "kernel0")
    assert "for roffset" in src
    for line in src.splitlines():  # a buffer this kernel writes is never loaded by it
        if "tl.load(" in line:
            assert "buf" not in line.split("tl.load(")[1].split("+")[0]


def test_builder_caches_source_on_disk_and_in_memory(tmp_path, monkeypatch):
    from kiln.runtime import triton_builder

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))

    def fn(x):
        return (torch.tanh(x) * 3.25 + 0.125,)

    x = torch.randn(300)
    before = dict(triton_builder.STATS)
    c1 = check(fn, x)
    walk = os.walk(tmp_path / "triton")
    paths = [os.path.join(d, f) for d, _, fs in walk for f in fs if f.endswith(".py")]
    assert len(paths) == 1
    with open(paths[0]) as f:
        assert f.read() == c1.triton_source
    c2 = check(fn, x)
    assert c2.triton_source == c1.triton_source
    assert triton_builder.STATS["memory_hits"] == before["memory_hits"] + 1
    triton_builder._loaded.clear()  # a new process: the file on disk is reused
    check(fn, x)
    assert triton_builder.STATS["disk_hits"] == before["disk_hits"] + 1


def test_options_fuel_zero_gives_one_kernel_per_node():
    from kiln.options import build_options

    def fn(x):
        return ((x.exp() + 1) * 2,)

    opts = build_options(options={"debug.fuel": 0})
    c = compile_fn(fn, torch.randn(64), options=opts)
    assert kernel_count(c) >= 2
    check(fn, torch.randn(64), compiled=c)
