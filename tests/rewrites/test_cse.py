"""Common-subexpression elimination (rewrites/cse.py, the rewrite `merge_repeats`): repeats of a
call merge into the first one before lowering, so the loop IR computes each value once; random
ops, in-place graphs, graph outputs and scalars that only look alike (-0.0 and 0.0, 1 and 1.0)
are never merged. Every compiled graph is compared with eager on fresh random inputs (the C++
path).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.codegen import compile_graph_strict
from kiln.lower import lower_graph
from kiln.lower.ir import Extern, Pointwise, Reduction
from kiln.rewrites.cse import common_subexpressions, merge_repeats


def _functional(fn, *inputs):
    return make_fx(torch.func.functionalize(fn, remove="mutations_and_views"))(*inputs)


def _compiled_matches_eager(fn, *inputs):
    compiled = compile_graph_strict(make_fx(fn)(*inputs), list(inputs))
    fresh = [torch.randn_like(x) for x in inputs]
    for args in (inputs, fresh):
        for got, want in zip(compiled(*args), fn(*args)):
            torch.testing.assert_close(got, want, equal_nan=True)
            assert torch.equal(got.signbit(), want.signbit())  # -0.0 is not 0.0
    return compiled


def _merged_and_lowered(fn, *inputs):
    gm = make_fx(fn)(*inputs)
    merge_repeats(gm, list(inputs))
    return lower_graph(gm, list(inputs))


def _computed(graph) -> list:
    return [n for n in graph.nodes if isinstance(n, (Pointwise, Reduction, Extern))]


def _repeats_by_name(fn, *inputs) -> dict[str, str]:
    gm = make_fx(fn)(*inputs)
    return {d.name: r.name for d, r in common_subexpressions(gm.graph).items()}


def test_a_mask_built_in_every_layer_is_built_once_and_matches_eager():
    def mask(x):  # what HF GPT-2 spells in each layer: the same inputs, the same scalars
        n = x.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        return torch.where(causal, torch.scalar_tensor(0.0), torch.scalar_tensor(-65504.0))

    def per_layer(x):
        h = x
        for _ in range(3):
            h = torch.softmax(h + mask(x) + h.sum(-1, keepdim=True), -1)
        return (h,)

    def once(x):
        m = mask(x)
        h = x
        for _ in range(3):
            h = torch.softmax(h + m + h.sum(-1, keepdim=True), -1)
        return (h,)

    x = torch.randn(2, 16, 16)
    merged = _merged_and_lowered(per_layer, x)
    by_hand = lower_graph(make_fx(once)(x), [x])
    assert len(_computed(merged)) == len(_computed(by_hand))
    trils = [n for n in merged.nodes if str(getattr(n, "target", "")) == "aten.tril.default"]
    assert len(trils) == 1
    _compiled_matches_eager(per_layer, x)


def test_repeated_reductions_are_computed_once():
    def fn(x, y):
        a = (x * y).sum(-1)
        b = (x * y).sum(-1)  # the same value, spelled twice
        return (a * 2 + b.sin(),)

    x, y = torch.randn(8, 32), torch.randn(8, 32)
    graph = _merged_and_lowered(fn, x, y)
    assert sum(isinstance(n, Reduction) for n in graph.nodes) == 1
    _compiled_matches_eager(fn, x, y)


def test_merging_is_logged_with_the_count():
    def fn(x):
        return ((x + 1).exp() * (x + 1).exp(),)

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    keep = Keep()
    logging.getLogger("kiln.schedule").addHandler(keep)
    kiln.set_logs("schedule")
    try:
        _merged_and_lowered(fn, torch.randn(16))
    finally:
        kiln.set_logs()
        logging.getLogger("kiln.schedule").removeHandler(keep)
    lines = [m for m in records if "common subexpressions" in m]
    assert lines == ["common subexpressions: merged 2 nodes into earlier equal ones "
                     "(add.Tensor x1, exp.default x1)"]  # fmt: skip


def test_dropout_twice_draws_two_masks():
    def fn(x):
        return (F.dropout(x, 0.5, training=True), F.dropout(x, 0.5, training=True))

    x = torch.randn(64, 64)
    gm = _functional(fn, x)
    repeats = common_subexpressions(gm.graph)
    assert not any("bernoulli" in str(d.target) for d in repeats)
    compiled = compile_graph_strict(gm, [x])
    for args in ((x,), (torch.randn(64, 64),)):
        a, b = compiled(*args)
        for out in (a, b):  # each is a dropout of x: zeros or x / 0.5, and both kinds occur
            kept = out != 0
            torch.testing.assert_close(out[kept], 2 * args[0][kept])
            assert 0 < kept.sum() < out.numel()
        assert not torch.equal(a != 0, b != 0)


def test_random_ops_are_never_merged():
    def fn(x):
        return (torch.rand_like(x) + torch.rand_like(x), torch.randn(4) * torch.randn(4))

    assert _repeats_by_name(fn, torch.randn(4)) == {}


def test_equal_outputs_stay_separate_tensors():
    def fn(x):
        z = torch.zeros(3)
        return (z, torch.zeros(3), x.view(2, 3) * 2, (x * 2).view(2, 3))

    x = torch.randn(6)
    # the repeats are outputs (or viewed by one): merged, writing into one would show in another
    assert _repeats_by_name(fn, x) == {}
    compiled = _compiled_matches_eager(fn, x)
    outs = compiled(x)
    assert len({o.data_ptr() for o in outs}) == len(outs)


def test_a_repeat_feeding_an_output_merges_when_the_output_is_not_it():
    def fn(x):
        return ((x * 2).view(2, 3) + 1, (x * 2).view(3, 2) - 1)

    assert _repeats_by_name(fn, torch.randn(6)) == {"mul_1": "mul"}
    _compiled_matches_eager(fn, torch.randn(6))


def test_scalars_merge_only_when_type_and_bits_agree():
    def fn(x):
        return (
            x + 1 / torch.full((3,), 0.0),  # +inf
            x + 1 / torch.full((3,), -0.0),  # -inf: -0.0 and 0.0 differ
            x + torch.full((3,), 1) + torch.full((3,), 1.0) + torch.full((3,), True),
            x + torch.full((3,), float("nan")) + torch.full((3,), float("nan")),
            x.clamp(0.5) + x.clamp(0.5),
        )

    repeats = _repeats_by_name(fn, torch.randn(3))
    assert repeats == {"full_6": "full_5", "clamp_1": "clamp"}
    _compiled_matches_eager(fn, torch.randn(3))


def test_graphs_that_write_in_place_merge_nothing():
    def fn(x):
        a = torch.empty_like(x).fill_(1.0)
        b = torch.empty_like(x).fill_(2.0)  # equal calls, different buffers once filled
        return (a + b,)

    gm = make_fx(fn)(torch.randn(4))
    assert any(n.target is torch.ops.aten.fill_.Scalar for n in gm.graph.nodes)
    assert common_subexpressions(gm.graph) == {}
