"""The scheduler: what fuses (softmax, layer norm, pointwise chains), what does not and why,
buffer reuse, and optimization fuel. Assertions are on the schedule and on the generated code;
compiled results are compared with eager on fresh random inputs.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.lower import lower_graph
from kiln.lower.ir import Pointwise, Reduction
from kiln.options import build_options
from kiln.schedule import Alloc, ExternCall, Kernel, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from cg_helpers import check  # noqa: E402


def _schedule(fn, *inputs, **kw):
    gm = make_fx(fn)(*inputs)
    return schedule(lower_graph(gm, inputs), verify_ir=True, **kw)


def test_softmax_is_one_kernel_with_local_row_values():
    s = _schedule(lambda x: torch.softmax(x, -1), torch.randn(64, 100))
    (kernel,) = s.kernels
    nodes = s.graph.node_map()
    kinds = [type(nodes[m.name]).__name__ for m in kernel.members]
    assert kinds == ["Reduction", "Reduction", "Pointwise"]
    # max and sum never reach memory: they live in registers for their row.
    assert {m.name for m in kernel.members if isinstance(nodes[m.name], Reduction)} == set(
        kernel.local
    )
    c = check(lambda x: torch.softmax(x, -1), torch.randn(64, 100))
    assert c.cpp_source.count('extern "C" void kernel') == 1


def test_layer_norm_and_log_softmax_are_one_kernel_each():
    def fn(x, w, b):
        return F.layer_norm(x, (96,), w, b), torch.log_softmax(x, -1)

    s = _schedule(fn, torch.randn(8, 16, 96), torch.randn(96), torch.randn(96))
    assert len(s.kernels) <= 2
    for k in s.kernels:
        assert k.outer == 8 * 16 and k.inner == 96
    check(fn, torch.randn(8, 16, 96), torch.randn(96), torch.randn(96))


@pytest.mark.parametrize("shape", [(1, 1, 96), (4, 1, 96), (2, 3, 96)])
def test_residual_add_and_layer_norm_with_unit_dims_are_one_kernel(shape):
    # A decode step's rows are [1, 1, C] and its statistics [1, 1]: dimensions of size 1 must
    # not make the normalization look like it reads another row (it took three kernels).
    def fn(x, y, w, b):
        h = x + y
        return h, F.layer_norm(h, (96,), w, b)

    args = (torch.randn(shape), torch.randn(shape), torch.randn(96), torch.randn(96))
    s = _schedule(fn, *args)
    assert len(s.kernels) == 1
    check(fn, *args)


def test_six_op_pointwise_chain_is_one_kernel_one_expression():
    def fn(x, y):
        return ((x + y).exp() * 0.5 - y).sigmoid().neg().relu()

    s = _schedule(fn, torch.randn(32, 64), torch.randn(32, 64))
    (kernel,) = s.kernels
    assert len(kernel.members) == 1
    (node,) = [n for n in s.graph.nodes if isinstance(n, Pointwise)]
    text = str(node)
    for op in ("add(", "exp(", "mul(", "sub(", "sigmoid(", "neg(", "maximum("):
        assert op in text
    c = check(fn, torch.randn(32, 64), torch.randn(32, 64))
    assert c.wrapper_source.count("kernel0(") == 1 and "kernel1" not in c.wrapper_source


def test_buffer_is_reused_after_its_last_reader():
    def fn(x, w):
        h = torch.relu(x) @ w
        # (h is read at another element too: not stored over h, so it takes a freed buffer)
        return (torch.sigmoid(h) + h.t()) @ w

    x, w = torch.randn(64, 64), torch.randn(64, 64)
    s = _schedule(fn, x, w)
    reused = [st for st in s.steps if isinstance(st, Alloc) and st.reuse]
    assert reused, str(s)
    c = check(fn, x, w)
    reused = [st for st in c.schedule.steps if isinstance(st, Alloc) and st.reuse]
    assert reused and f"= {reused[0].reuse}.view(" in c.wrapper_source


def _logged_schedule(fn, *inputs):
    """(the schedule of `fn`, the messages `KILN_LOGS=schedule` gave while making it)"""
    records = []

    class H(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    h = H()
    logging.getLogger("kiln.schedule").addHandler(h)
    kiln.set_logs("schedule")
    try:
        return _schedule(fn, *inputs), records
    finally:
        kiln.set_logs()
        logging.getLogger("kiln.schedule").removeHandler(h)


def test_refusal_is_logged_with_reason(capsys):
    _, first = _logged_schedule(lambda x: x.sum(0) + x.t(), torch.randn(16, 16))
    _, second = _logged_schedule(lambda x: torch.softmax(x, 0).exp(), torch.randn(8, 12))
    handler_records = first + second
    refusals = [m for m in handler_records if "not fused" in m]
    assert refusals and all(":" in m for m in refusals), handler_records


def test_fuel_zero_disables_fusion_and_results_still_match():
    def fn(x):
        return torch.softmax(x * 2 + 1, -1).relu()

    x = torch.randn(16, 32)
    full = _schedule(fn, x)
    none = _schedule(fn, x, fuel=0)
    assert len(none.kernels) > len(full.kernels) == 1
    counts = [len(_schedule(fn, x, fuel=n).kernels) for n in range(8)]
    assert counts == sorted(counts, reverse=True) and counts[-1] == 1
    check(fn, x, options=build_options(options={"debug.fuel": 0}))


def test_extern_breaks_fusion_but_epilogue_fuses_with_consumer():
    def fn(x, w):
        return (x @ w).relu() * 2 + 1

    s = _schedule(fn, torch.randn(8, 8), torch.randn(8, 8))
    assert isinstance([st for st in s.steps if isinstance(st, (Kernel, ExternCall))][0], ExternCall)
    assert len(s.kernels) == 1


def test_kernel_never_moves_before_a_tuple_extern_it_reads():
    # Two independent samples, each a tuple-returning extern call and a pointwise consumer of
    # its items: the second consumer must not join the first kernel, which runs before the
    # second extern call (the wrapper raised UnboundLocalError for logdet, ctc_loss, ...).
    def fn(a, b):
        va, ia = torch.sort(a, -1)
        ra = va * 2 + ia
        vb, ib = torch.sort(b, -1)
        return ra, vb * 3 - ib

    s = _schedule(fn, torch.randn(4, 16), torch.randn(4, 16))
    order = [type(st).__name__ for st in s.steps if isinstance(st, (Kernel, ExternCall))]
    assert order == ["ExternCall", "Kernel", "ExternCall", "Kernel"], order
    check(fn, torch.randn(4, 16), torch.randn(4, 16))


def test_view_of_a_reshape_stays_an_alias_and_kernels_index_without_division():
    from kiln.lower.indexing import FloorDiv, ModularIndexing, index_vars, linearize

    i0, i1 = index_vars(2)
    folded = linearize([FloorDiv(i1, 128), ModularIndexing(i1, 128), i0], [131072, 1024, 1])
    assert folded == i0 + 1024 * i1

    def fn(x, w):
        y = (x * 2).view(4, 32, 64).view(128, 64).t()  # a transposed reshape: strided
        return y @ w, (y + 1).sum(1)

    s = _schedule(fn, torch.randn(4, 32, 64), torch.randn(128, 16))
    assert len(s.kernels) == 2  # x * 2, then the sum: no copy of the view for the matmul
    c = check(fn, torch.randn(4, 32, 64), torch.randn(128, 16))
    assert "/" not in c.cpp_source.split("void kernel")[-1].split("{", 1)[1]
    assert "%" not in c.cpp_source.split("void kernel")[-1].split("{", 1)[1]


def test_a_view_is_freed_after_its_last_reader():
    # The alias holds its base's storage: dropping only the base kept it alive to the end.
    from kiln.schedule import Alias, Free

    def fn(x, w):
        y = (x + 1).t() @ w  # an alias of a kernel's buffer, read by one extern call
        return (y * 3).relu()

    s = _schedule(fn, torch.randn(16, 16), torch.randn(16, 8))
    steps = list(s.steps)
    (alias,) = [st for st in steps if isinstance(st, Alias)]
    mm_at = next(k for k, st in enumerate(steps) if isinstance(st, ExternCall))
    assert s.graph.node_map()[steps[mm_at].name].args[0].name == alias.name
    assert Free(alias.name) in steps[mm_at + 1 :]
    c = check(fn, torch.randn(16, 16), torch.randn(16, 8))
    assert f"del {alias.name}" in c.wrapper_source


def test_costly_pointwise_read_broadcast_is_stored_once_not_recomputed_per_reader_element():
    # Llama's rotary embedding: cos and sin of [seq, dim] angles, read by q and k of every
    # batch and head. Inlined, each cos was computed batch x heads times over.
    def fn(q, k, inv_freq):
        angles = torch.arange(32, dtype=torch.float32)[:, None] * inv_freq[None, :]
        cos, sin = angles.cos(), angles.sin()
        return q * cos + q.flip(-1) * sin, k * cos - k * sin

    args = torch.randn(2, 4, 32, 16), torch.randn(2, 2, 32, 16), torch.rand(16)
    c = check(fn, *args)
    assert c.cpp_source.count("std::cos(") == 1 and c.cpp_source.count("std::sin(") == 1
    nodes = c.schedule.graph.node_map()
    stored = [
        m.name
        for k in c.schedule.kernels
        for m in k.members
        if isinstance(nodes[m.name], Pointwise) and tuple(nodes[m.name].size) == (32, 16)
    ]
    assert len(stored) == 2  # cos and sin, each a [32, 16] buffer


def test_broadcast_costly_pointwise_of_a_symbolic_length_is_stored_as_a_static_ones_is():
    """The same rotary angles over a length known only per call: storing them is a speed
    decision, made at the length first seen (it was made for static lengths only, and q's and
    k's kernels each computed cos and sin again); one build is right at every length."""
    from cg_helpers import trace_dynamic

    from kiln.codegen import compile_graph_strict

    def fn(q, k, inv_freq):
        angles = torch.arange(q.shape[2], dtype=torch.float32)[:, None] * inv_freq[None, :]
        cos, sin = angles.cos(), angles.sin()
        return q * cos + q.flip(-1) * sin, k * cos - k * sin

    example = (torch.randn(2, 4, 32, 16), torch.randn(2, 2, 32, 16), torch.rand(16))
    gm = trace_dynamic(fn, example, {0: (2,), 1: (2,)})
    compiled = compile_graph_strict(gm, list(example), "cpu")
    assert compiled.schedule.graph.symbolic
    source = compiled.cpp_source
    assert source.count("std::cos(") == 1 and source.count("std::sin(") == 1
    for n in (3, 32, 45):
        args = (torch.randn(2, 4, n, 16), torch.randn(2, 2, n, 16), torch.rand(16))
        for got, want in zip(compiled(*args), fn(*args)):
            torch.testing.assert_close(got, want)


def test_costly_pointwise_read_at_its_own_size_stays_inlined():
    # exp read element for element by two readers of its own size: recomputing it is cheaper
    # than a round trip through memory (and softmax's sum and output share one kernel).
    s = _schedule(lambda x: (x.exp() * 2, x.exp().sum(-1)), torch.randn(64, 100))
    assert len(s.kernels) == 1


def _qkv(q, k, v):
    """An attention layer's operand preparation: Q and K scaled, K transposed, V as is."""
    b, s, h, d = q.shape
    return (
        (q.transpose(1, 2) * 0.125).contiguous(),
        (k.permute(0, 2, 3, 1) * 0.125).contiguous(),
        v.transpose(1, 2).contiguous(),
    )


def test_a_transposed_read_of_another_shape_keeps_its_own_kernel():
    qkv = [torch.randn(2, 32, 4, 16) for _ in range(3)]
    s, records = _logged_schedule(_qkv, *qkv)
    nodes = s.graph.node_map()
    shapes = [{tuple(nodes[m.name].size) for m in k.members} for k in s.kernels]
    assert all(len(x) == 1 for x in shapes), shapes  # no kernel mixes [.., 32, 16] and [.., 16, 32]
    assert any("transposed" in m and "not fused" in m for m in records), records
    check(_qkv, *qkv)


def test_pointwise_nodes_of_one_shape_still_share_a_kernel():
    def fn(q, k):
        return (q.transpose(1, 2) * 0.5).contiguous(), (k.transpose(1, 2) + 1).contiguous()

    s = _schedule(fn, torch.randn(2, 32, 4, 16), torch.randn(2, 32, 4, 16))
    assert len(s.kernels) == 1


def test_work_on_inputs_alone_is_not_moved_back_across_an_extern_call():
    # `b * 2` reads only an input; joined to the kernel of `a * 2` (same shape) it would run
    # before the first matmul and its buffer would live across it (a conv net's weight copies
    # stacked up that way).
    def fn(x, a, b):
        h = x @ (a * 2)
        return h @ (b * 2)

    x, a, b = torch.randn(32, 48), torch.randn(48, 48), torch.randn(48, 48)
    s = _schedule(fn, x, a, b)
    order = [type(st).__name__ for st in s.steps if isinstance(st, (Kernel, ExternCall))]
    assert order == ["Kernel", "ExternCall", "Kernel", "ExternCall"], str(s)
    check(fn, x, a, b)
