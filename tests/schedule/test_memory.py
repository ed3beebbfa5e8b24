"""Memory planning: intermediates die at their last reader, inputs too (a caller that hands
its inputs over gets them freed mid-graph), and inlining does not stretch lifetimes across
extern calls (the residual stream of a transformer stays one buffer, not every layer's).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.lower import lower_graph
from kiln.lower.ir import Pointwise, buf_refs
from kiln.schedule import Alias, Alloc, ExternCall, Free, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from cg_helpers import check  # noqa: E402


def _schedule(fn, *inputs):
    return schedule(lower_graph(make_fx(fn)(*inputs), inputs), verify_ir=True)


def _most_extern_outputs_alive(sched) -> int:
    alive, most = set(), 0
    for step in sched.steps:
        if isinstance(step, ExternCall):
            alive.add(step.name)
        elif isinstance(step, Free):
            alive.discard(step.name)
        most = max(most, len(alive))
    return most


def _residual_stack(x, w1, w2, w3, w4):
    h = x
    for w in (w1, w2, w3, w4):  # pre-norm blocks: h = h + f(norm(h)), f an extern matmul
        h = h + torch.relu(F.layer_norm(h, (h.shape[-1],)) @ w)
    return (h * 2,)


def test_residual_stream_is_stored_instead_of_keeping_every_layers_output_alive():
    args = (torch.randn(32, 64),) + tuple(torch.randn(64, 64) / 8 for _ in range(4))
    s = _schedule(_residual_stack, *args)
    # inlined everywhere, the stream read all four matmul outputs in the last kernel
    assert _most_extern_outputs_alive(s) <= 2
    stored = [n for n in s.graph.nodes if isinstance(n, Pointwise) and n.size == (32, 64)]
    assert len(stored) >= 3  # the stream, from the second layer on, and the output
    check(_residual_stack, *args, rtol=1e-5, atol=1e-4)  # 4 norms: sums in another order


def test_inputs_are_freed_after_their_last_reader_unless_returned():
    def fn(x, y, z):
        t = x.exp() @ y
        return t + 1, z

    args = (torch.randn(8, 16), torch.randn(16, 4), torch.randn(3))
    s = _schedule(fn, *args)
    steps = list(s.steps)
    mm_at = next(k for k, st in enumerate(steps) if isinstance(st, ExternCall))
    assert Free("arg0") in steps[:mm_at]  # x: dead once exp(x) is computed
    assert Free("arg1") in steps[mm_at + 1 :]  # y: dead after the matmul
    assert Free("arg2") not in steps  # z is returned
    c = check(fn, *args)
    assert "del arg0" in c.wrapper_source


def test_a_buffer_an_extern_view_op_aliases_is_freed_but_never_reused():
    from kiln.schedule import Alloc

    def fn(x, w):
        y = x * 2  # a kernel's buffer; as_strided (an extern call) returns views of it
        a, b = (y.as_strided((8, 4), (8, 1), offset) for offset in (0, 4))
        z = (a @ w).exp()
        return (z, b + 1, (x - 3).sin())  # same size and dtype as y: a reuse candidate

    args = (torch.randn(8, 8), torch.randn(4, 8))
    s = _schedule(fn, *args)
    nodes = s.graph.node_map()
    split = [
        st
        for st in s.steps
        if isinstance(st, ExternCall) and "as_strided" in str(nodes[st.name].target)
    ][0]
    y = nodes[split.name].args[0].name
    y = getattr(nodes[y], "base", y)
    assert Free(y) in s.steps  # its split's views keep the storage; the name goes
    assert not any(isinstance(st, Alloc) and st.reuse == y for st in s.steps)
    check(fn, *args)


def test_matmul_outputs_are_planned_buffers_that_later_steps_reuse():
    # Matmuls are called with out= into buffers of the plan, which return to the pool like a
    # kernel's: a stack of linear layers cycles through a few buffers instead of asking the
    # allocator for fresh ones (that the OS hands back as page faults, every call).
    def fn(x, ws, bs):
        h = x
        for k in range(4):
            # (gelu reads the matmul transposed: not stored over it, so freed buffers are taken)
            h = h + F.gelu(F.linear(h, ws[k], bs[k])).t()
        return torch.bmm(h.view(4, 8, 32), h.view(4, 32, 8)).softmax(-1)

    x, ws, bs = torch.randn(32, 32), torch.randn(4, 32, 32), torch.randn(4, 32)
    c = check(fn, x, ws, bs)
    src = c.wrapper_source
    assert src.count("aten_addmm_out(") == 4 and src.count("aten_bmm_out(") == 1
    assert "aten_addmm_default" not in src
    reused = [s for s in c.schedule.steps if isinstance(s, Alloc) and s.reuse]
    assert any(s.name.startswith("extern") for s in reused)  # a matmul wrote a reused buffer
    assert any(s.reuse.startswith("extern") for s in reused)  # and a freed one was taken


def test_out_variants_are_not_used_when_the_schedule_is_not_told():
    # The Triton wrapper calls extern ops functionally: without out_externs the plan leaves
    # matmul outputs to ATen.
    def fn(x, w):
        return (x @ w).relu()

    s = _schedule(fn, torch.randn(8, 16), torch.randn(16, 8))
    assert not any(isinstance(st, Alloc) and st.name.startswith("extern") for st in s.steps)


def test_a_freed_buffer_is_not_kept_across_the_peak_for_a_later_reuse():
    # s1 dies before the big step; s2 (same size) comes after it. Keeping s1's storage for s2
    # would hold it through the graph's peak and raise it: s2 gets its own buffer instead.
    def fn(x, y, w):
        m1 = (x * 3) @ x
        big = (y * 2) @ w
        return big, (m1 - 1) @ x

    x, y, w = torch.randn(32, 32), torch.randn(256, 256), torch.randn(256, 256)
    c = check(fn, x, y, w)
    allocs = [s for s in c.schedule.steps if isinstance(s, Alloc)]
    small = [s for s in allocs if s.name.startswith("buf")]
    assert len(small) == 3  # x * 3, y * 2, m1 - 1
    assert small[2].reuse is None


def test_a_view_is_made_just_before_its_first_reader():
    """Transposed weights are views of inputs; each is made right before the matmul that reads
    it, not all before the first launch (where the device would wait for them)."""

    def fn(x, w1, w2, w3):
        h = x
        for w in (w1, w2, w3):
            h = torch.relu(h @ w.t())
        return (h,)

    args = (torch.randn(8, 16),) + tuple(torch.randn(16, 16) for _ in range(3))
    s = _schedule(fn, *args)
    steps = list(s.steps)
    aliases = [k for k, st in enumerate(steps) if isinstance(st, Alias)]
    matmuls = [k for k, st in enumerate(steps) if isinstance(st, ExternCall)]
    assert len(aliases) == len(matmuls) == 3
    for alias, mm in zip(aliases, matmuls):  # each view comes after the previous matmul
        assert steps[alias].name in {ref.name for ref in _extern_reads(s, steps[mm])}
        assert not [k for k in matmuls if alias < k < mm]
    check(fn, *args)


def _extern_reads(sched, step):
    node = sched.graph.node_map()[step.name]
    return buf_refs((node.args, node.kwargs))
