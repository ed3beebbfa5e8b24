"""codegen/pad_mm.py: a large matmul with an unaligned output width is computed padded."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.rewrites import pad_mm

aten = torch.ops.aten


def _head(x, w, b):
    # a language-model head: [rows, width] @ [vocab, width].t(), vocab not a multiple of 8
    return torch.addmm(b, x, w.t()), x @ w.t()


def _inputs():
    return torch.randn(96, 40), torch.randn(1001, 40), torch.randn(1001)


def test_unaligned_product_is_padded_and_matches_eager(monkeypatch):
    monkeypatch.setattr(pad_mm, "MIN_WORK", 0)
    args = _inputs()
    gm = make_fx(_head)(*args)
    assert pad_mm.pad_matmuls(gm, args, devices=("cpu",)) == 2
    pads = [n for n in gm.graph.nodes if n.target is aten.constant_pad_nd.default]
    assert len(pads) == 3  # both weights and the bias, to 1004 (float32: 4 elements = 16 B)
    # the weights [1001, 40] get rows (a contiguous copy) and are then transposed
    assert sorted(tuple(n.meta["val"].shape) for n in pads) == [(1004,), (1004, 40), (1004, 40)]
    for _ in range(2):
        fresh = tuple(torch.randn_like(a) for a in args)
        for got, want in zip(gm(*fresh), _head(*fresh)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want)


def test_small_or_aligned_products_stay_whole():
    args = _inputs()
    gm = make_fx(_head)(*args)
    assert pad_mm.pad_matmuls(gm, args, devices=("cpu",)) == 0  # below MIN_WORK
    aligned = (torch.randn(96, 40), torch.randn(1000, 40), torch.randn(1000))
    gm = make_fx(_head)(*aligned)
    assert pad_mm.pad_matmuls(gm, aligned, devices=("cpu",)) == 0
    # only the configured devices are padded (the GPU by default)
    gm = make_fx(_head)(*args)
    assert pad_mm.pad_matmuls(gm, args) == 0


def test_rewrite_is_undone_when_a_reader_needs_the_product_contiguous(monkeypatch):
    monkeypatch.setattr(pad_mm, "MIN_WORK", 0)

    def flat(x, w):
        return (x @ w.t()).view(-1) * 2  # view(-1) of the narrow view is impossible

    args = (torch.randn(96, 40), torch.randn(1001, 40))
    gm = make_fx(flat)(*args)
    assert pad_mm.pad_matmuls(gm, args, devices=("cpu",)) == 0
    assert not [n for n in gm.graph.nodes if n.target is aten.constant_pad_nd.default]
    torch.testing.assert_close(gm(*args), flat(*args))


def _shape_env(gm):
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if n.op == "placeholder" and isinstance(v, torch.Tensor):
            for s in v.shape:
                if isinstance(s, torch.SymInt):
                    return s.node.shape_env
    raise AssertionError("no symbolic size in the graph")


def test_symbolic_rows_are_judged_at_their_hint_without_a_shape_guard(monkeypatch):
    """Padding is a speed decision: rows known only per call are judged at the size first seen,
    and the shape environment gets no guard (`s0 >= 64` made every shorter length, a decode
    step's, trace and compile again); the padded graph is right at any number of rows."""
    from cg_helpers import trace_dynamic

    monkeypatch.setattr(pad_mm, "MIN_WORK", 96 * 1001 * 40)  # the hint's product just pays
    args = _inputs()
    gm = trace_dynamic(_head, args, {0: (0,)})
    env = _shape_env(gm)
    guards = len(env.guards)
    assert pad_mm.pad_matmuls(gm, args, devices=("cpu",)) == 2
    assert len(env.guards) == guards, [str(g.expr) for g in env.guards[guards:]]
    for rows in (1, 7, 96, 130):  # below MIN_ROWS and the hint's work, and above both
        fresh = (torch.randn(rows, 40), torch.randn(1001, 40), torch.randn(1001))
        for got, want in zip(gm(*fresh), _head(*fresh)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want)
    # at a hint too small to pay, nothing is padded, again without a guard
    small = (torch.randn(8, 40), *args[1:])
    gm = trace_dynamic(_head, small, {0: (0,)})
    env = _shape_env(gm)
    guards = len(env.guards)
    assert pad_mm.pad_matmuls(gm, small, devices=("cpu",)) == 0
    assert len(env.guards) == guards
