"""The min-cut partition: max-flow itself, what is saved and recomputed, and that every
strategy still computes eager's gradients. Also the aot_graphs log and double backward."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from aot_helpers import clone_inputs, compare, lift
from test_transformer import GPT, _batch

import kiln
from kiln.autograd import aot_compile
from kiln.autograd.backend import (
    aot_eager,
    aot_eager_decomp_partition,
    aot_eager_save_all,
    eager_graph,
)
from kiln.autograd.mincut import INF, FlowNetwork, choose_saved

aten = torch.ops.aten


def test_max_flow_on_a_textbook_network():
    # CLRS figure 26.1: the maximum flow is 23
    net = FlowNetwork()
    for a, b, c in [
        ("s", "v1", 16), ("s", "v2", 13), ("v1", "v3", 12), ("v2", "v1", 4),
        ("v2", "v4", 14), ("v3", "v2", 9), ("v3", "t", 20), ("v4", "v3", 7), ("v4", "t", 4),
    ]:  # fmt: skip
        net.add_edge(a, b, c)
    flow, source_side = net.min_cut("s", "t")
    assert flow == 23
    assert source_side == {"s", "v1", "v2", "v4"}


def test_choose_saved_prefers_the_small_value_and_recomputes_cheap_chains():
    # x -> mm (expensive, 400 B) -> a (cheap, 400 B) -> mask (cheap, 100 B); backward reads
    # a and mask: saving mm or a costs the same bytes; a is read by the backward itself, so
    # saving it recomputes only the mask (saving mm would recompute a as well)
    nodes = ["x", "mm", "a", "mask"]
    users = {"x": ["mm"], "mm": ["a"], "a": ["mask"]}
    size = {"x": 400, "mm": 400, "a": 400, "mask": 100}
    saved = choose_saved(nodes, users, {"x", "mm"}, {"a", "mask"}, size)
    assert saved == ["a"]
    # a chain of cheap values the backward does not read: saved where it starts (mm), not at
    # a larger value further on
    size_big_a = dict(size, a=800)
    assert choose_saved(nodes, users, {"x", "mm"}, {"mask"}, size_big_a) == ["mask"]
    assert choose_saved(nodes, users, {"x", "mm"}, {"a", "mask"}, size_big_a) == ["mm"]
    # backward reads only the mask: saving the 100-byte mask beats saving mm
    assert choose_saved(nodes, users, {"x", "mm"}, {"mask"}, size) == ["mask"]
    # an unsaveable value (a tuple) forces the cut elsewhere
    size_tuple = dict(size, mm=INF)
    assert choose_saved(nodes, users, {"x", "mm"}, {"a", "mask"}, size_tuple) == ["a"]


def _partitions(fn, args, partition):
    compiled = aot_compile(
        torch.fx.symbolic_trace(fn),
        clone_inputs(args),
        fw_compiler=eager_graph,
        bw_compiler=eager_graph,
        partition=partition,
    )
    (part,) = compiled.partitions.values()
    return compiled, part


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_pointwise_chain_is_recomputed_not_saved():
    def f(x, w):
        h = x @ w
        return ((h.sin() * 2).exp().tanh() + h.cos(),)

    args = [torch.randn(16, 32, requires_grad=True), torch.randn(32, 64, requires_grad=True)]
    compiled, cut = _partitions(f, args, "min_cut")
    _, all_ = _partitions(f, args, "save_all")
    assert cut.saved_bytes < all_.saved_bytes
    assert "mm" in cut.saved and cut.recomputed  # the matmul output is saved, the chain isn't
    assert aten.sin.default in _targets(cut.bw)  # recomputed from the saved mm
    assert _targets(cut.fw).count(aten.mm.default) == 1
    assert _targets(cut.bw).count(aten.mm.default) == 2  # the two gradient matmuls, no rerun
    compare(torch.fx.symbolic_trace(f), args, compiled=compiled)


def test_random_and_expensive_ops_are_never_recomputed():
    gm, params = lift(GPT().train(True), 2)
    idx, targets = _batch()
    inputs = [idx, targets, *params]
    # the decomposed graphs have the most cheap ops around expensive ones: the hardest case
    decomposed = aot_eager_decomp_partition(gm, clone_inputs(inputs))
    part = next(iter(decomposed.partitions.values()))
    expensive = {
        aten.mm.default,
        aten.bmm.default,
        aten.addmm.default,
        aten.bernoulli.p,
        aten.var_mean.correction,
        aten._softmax.default,
        aten._log_softmax.default,
    }
    recomputed = [n.target for n in part.bw.graph.nodes if n.name in part.recomputed]
    assert recomputed and not expensive & set(recomputed), recomputed
    assert aten.bernoulli.p in _targets(part.fw) and aten.bernoulli.p not in _targets(part.bw)
    compare(gm, inputs, compiled=decomposed, seed=7, calls=1, atol=2e-5, rtol=1e-4)


def test_min_cut_saves_less_than_save_all_on_gpt():
    gm, params = lift(GPT().train(True), 2)
    idx, targets = _batch()
    inputs = [idx, targets, *params]
    cut = next(iter(aot_eager(gm, clone_inputs(inputs)).partitions.values()))
    save_all = aot_eager_save_all(gm, clone_inputs(inputs))
    part_all = next(iter(save_all.partitions.values()))
    assert part_all.strategy == "save_all" and not part_all.recomputed
    assert cut.saved_bytes < part_all.saved_bytes
    compare(gm, inputs, compiled=save_all, seed=7, calls=1, atol=2e-5, rtol=1e-4)


def test_aot_graphs_log_prints_forward_and_backward():
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("kiln.aot_graphs")
    logger.addHandler(handler)
    try:
        kiln.set_logs("aot_graphs")
        x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 4)
        aot_eager(torch.fx.symbolic_trace(lambda x, w: ((x @ w).relu(),)), [x, w])
    finally:
        kiln.set_logs()
        logger.removeHandler(handler)
    text = "\n".join(r.getMessage() for r in records)
    assert "forward graph:" in text and "backward graph:" in text
    assert "torch.ops.aten.mm.default" in text and "saved" in text


def test_double_backward_is_refused_with_a_fix():
    def f(x, w):
        return (F.softplus(x @ w),)

    args = [torch.randn(3, 4, requires_grad=True), torch.randn(4, 2, requires_grad=True)]
    compiled = aot_eager(torch.fx.symbolic_trace(f), clone_inputs(args))
    x, w = clone_inputs(args)
    (y,) = compiled(x, w)
    with pytest.raises(RuntimeError, match="double backward is not supported.*backend='eager'"):
        torch.autograd.grad(y.sum(), x, create_graph=True)
    # first-order gradients still work on the same compiled function
    (y,) = compiled(x, w)
    (gx,) = torch.autograd.grad(y.sum(), x)
    ref_x = x.detach().requires_grad_()
    (ref,) = torch.autograd.grad(f(ref_x, w)[0].sum(), ref_x)
    torch.testing.assert_close(gx, ref)


def test_retain_graph_backward_twice():
    """The backward frees saved values early, except when the graph is retained."""

    def f(x, w):
        return (torch.tanh(x @ w).exp(),)

    args = [torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)]
    compiled = aot_eager(torch.fx.symbolic_trace(f), clone_inputs(args))
    x, w = clone_inputs(args)
    (y,) = compiled(x, w)
    y.sum().backward(retain_graph=True)
    first = x.grad.clone()
    y.sum().backward()
    torch.testing.assert_close(x.grad, 2 * first)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()


def test_residual_stream_is_saved_not_rebuilt_in_the_backward():
    """Each layer norm's backward reads its input, a running sum of the layers' outputs. Saving
    every sum costs as many bytes as saving the first value and every layer's output, but the
    latter rebuilds layer l's sum from l + 1 tensors in the backward: the sums are saved."""

    def fn(x, w0, w1, w2, w3):
        for w in (w0, w1, w2, w3):
            x = x + torch.nn.functional.layer_norm(x, (16,)) @ w
        return (x.sum(),)

    args = [torch.randn(8, 16, requires_grad=True)] + [
        torch.randn(16, 16, requires_grad=True) for _ in range(4)
    ]
    compiled, part = _partitions(fn, args, "min_cut")
    assert not [n for n in part.recomputed if n.startswith("add")], part.recomputed
    # beyond what eager autograd keeps, only each layer norm's per-row mean and 1/std: they
    # rebuild the normalized rows in the backward, where saving those rows would cost the
    # forward one more write of a full tensor
    _, saved_all = _partitions(fn, args, "save_all")
    row_stats = (8 * 4) * 2 * 4  # (8 rows of float32) x (mean, 1/std) x 4 layers
    assert part.saved_bytes <= saved_all.saved_bytes + row_stats
    compare(torch.fx.symbolic_trace(fn), args, compiled=compiled)


def test_values_both_passes_write_are_kept_not_recomputed():
    """A GELU's output feeds the next matmul, and that matmul's weight gradient reads it again:
    recomputing it in the backward would write it a second time, so it is saved; the GELU's
    derivative is rebuilt from the first matmul's output (written anyway), not computed and
    written in the forward. Likewise the layer norm's output, which a matmul reads in both."""

    def fn(x, w1, b1, w2, lw, lb):
        h = F.layer_norm(x, (32,), lw, lb)
        h = F.gelu(F.linear(h, w1, b1))
        return (F.linear(h, w2) + x,)

    args = [torch.randn(8, 32, requires_grad=True), torch.randn(64, 32, requires_grad=True)]
    args += [torch.randn(64, requires_grad=True), torch.randn(32, 64, requires_grad=True)]
    args += [torch.randn(32, requires_grad=True), torch.randn(32, requires_grad=True)]
    compiled, part = _partitions(fn, args, "min_cut")
    saved = {n.name: n.target for n in part.fw.graph.nodes if n.name in part.saved}
    assert aten.gelu.default in saved.values() and aten.addmm.default in saved.values(), saved
    assert aten.erf.default not in _targets(part.fw)  # the derivative is built in the backward
    assert aten.gelu.default not in _targets(part.bw)
    ln_out = next(n for n in part.fw.graph.nodes if n.target == aten.addmm.default).args[1]
    assert ln_out.name in part.saved
    # float32, layer norm and GELU decomposed: rounding differs from eager's fused kernels
    compare(torch.fx.symbolic_trace(fn), args, compiled=compiled, atol=1e-4, rtol=1e-4)
