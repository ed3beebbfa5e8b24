"""Activation checkpointing compiles: `torch.utils.checkpoint.checkpoint` regions are recorded in
the graph, their values are recomputed in the backward instead of saved, and gradients equal
eager's. What the partition saves (bytes of the forward's values kept for the backward) is the
memory measure: it is what the compiled step holds between forward and backward.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint as tc

import kiln
from kiln.autograd import aot_compile
from kiln.autograd.backend import eager_graph
from kiln.autograd.partition import value_bytes
from kiln.backends.builtin import fallbacks


class Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self, d: int = 32, layers: int = 3, mode: str | None = None) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(layers))
        self.mode = mode

    def forward(self, x):
        for block in self.blocks:
            if self.mode is None:
                x = block(x)
            else:
                x = tc.checkpoint(block, x, use_reentrant=self.mode == "reentrant")
        return x.pow(2).mean()


def _partitions_backend(store: list):
    """AOT autograd on eager kernels, keeping the compiled object to read its partitions."""

    def backend(gm, example_inputs):
        compiled = aot_compile(gm, example_inputs, fw_compiler=eager_graph, bw_compiler=eager_graph)
        store.append(compiled)
        return compiled

    return backend


def _step(model, x):
    model.zero_grad()
    loss = model(x)
    loss.backward()
    return loss, [p.grad.clone() for p in model.parameters()], x.grad


def _saved_bytes(mode: str | None) -> tuple[int, list[str]]:
    torch.manual_seed(0)
    model = Net(mode=mode)
    store: list = []
    compiled = kiln.compile(model, backend=_partitions_backend(store), fullgraph=True)
    x = torch.randn(16, 32, requires_grad=True)
    compiled(x).backward()
    (part,) = [p for c in store for p in c.partitions.values()]
    # activations only: saved inputs (the weights) are alive whatever the partition does
    inputs = {n.name for n in part.fw.graph.find_nodes(op="placeholder")}
    out = part.fw.graph.output_node() if hasattr(part.fw.graph, "output_node") else None
    out = out or next(n for n in reversed(part.fw.graph.nodes) if n.op == "output")
    values = list(out.args[0])[part.num_fw_outputs :]
    kept = [v for v in values if v.name not in inputs]
    return sum(value_bytes(v) for v in kept), part.notes


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
def test_checkpointed_model_matches_eager(mode):
    torch.manual_seed(0)
    eager = Net(mode=mode)
    torch.manual_seed(0)
    model = Net(mode=mode)
    fell_back = fallbacks()
    compiled = kiln.compile(model, fullgraph=True)  # one graph, kiln's code generator
    for _ in range(3):
        x = torch.randn(16, 32)
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        le, ge, gxe = _step(eager, xe)
        lc, gc, gxc = _step(compiled, xc)
        torch.testing.assert_close(lc, le)
        torch.testing.assert_close(gxc, gxe)
        for a, b in zip(gc, ge):
            torch.testing.assert_close(a, b)
    assert fallbacks() == fell_back


def test_checkpointing_saves_less_than_the_plain_compiled_step():
    plain, plain_notes = _saved_bytes(None)
    for mode in ("non_reentrant", "reentrant"):
        saved, notes = _saved_bytes(mode)
        assert any(n.startswith("checkpointed:") for n in notes), notes
        # each block keeps only its input (16 x 32 floats) instead of its hidden activations
        # (16 x 128 floats, the norm's statistics, ...): well under half the bytes
        assert saved * 2 < plain, (mode, saved, plain)
    assert not any(n.startswith("checkpointed:") for n in plain_notes)


def test_dropout_inside_a_checkpointed_region_keeps_its_mask():
    """Random ops in a region are not recomputed: the backward uses the forward's mask."""

    def f(x, w):
        def region(y):
            return torch.nn.functional.dropout(torch.tanh(y @ w), p=0.5, training=True)

        return tc.checkpoint(region, x, use_reentrant=False).sum()

    compiled = kiln.compile(f, backend=_partitions_backend([]))
    x, w = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
    torch.manual_seed(3)
    compiled(x, w).backward()
    got = w.grad.clone()
    w.grad = None
    torch.manual_seed(3)
    f(x, w).backward()
    torch.testing.assert_close(got, w.grad)


def test_requires_grad_on_a_computed_tensor_is_a_no_op_and_compiles():
    # HF's gradient checkpointing calls `embeddings.requires_grad_(True)` on the embedding's
    # output: a no-op in eager; recorded in the graph, AOT autograd refused the whole graph.
    from kiln.backends import builtin

    emb = torch.nn.Embedding(20, 8)
    lin = torch.nn.Linear(8, 3)

    def step(ids):
        h = emb(ids)
        h.requires_grad_(True)
        return lin(h.relu()).sum()

    compiled = kiln.compile(step)
    before = len(builtin.fallbacks())
    for _ in range(2):
        ids = torch.randint(0, 20, (4, 5))
        emb.zero_grad()
        lin.zero_grad()
        loss = compiled(ids)
        loss.backward()
        got = [p.grad.clone() for p in (*emb.parameters(), *lin.parameters())]
        emb.zero_grad()
        lin.zero_grad()
        want_loss = step(ids)
        want_loss.backward()
        torch.testing.assert_close(loss, want_loss)
        for g, p in zip(got, (*emb.parameters(), *lin.parameters())):
            torch.testing.assert_close(g, p.grad)
    assert builtin.fallbacks()[before:] == []


def test_attention_without_dropout_in_a_checkpointed_region_is_recomputed():
    """Fused attention is tagged random (for its dropout); with dropout_p=0 it draws nothing,
    so a checkpointed region holding it is recomputed whole (before: its tuple result could be
    neither saved nor recomputed, and the partition saved everything)."""
    wq = torch.nn.Linear(16, 16)

    def layer(x):
        q = wq(x).view(2, 12, 2, 8).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        return x + a.transpose(1, 2).reshape(2, 12, 16).relu()

    def f(x):
        return tc.checkpoint(layer, x, use_reentrant=False).pow(2).mean()

    store: list = []
    compiled = kiln.compile(f, backend=_partitions_backend(store), fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 12, 16, requires_grad=True)
        wq.zero_grad()
        got = compiled(x)
        gx, gw = torch.autograd.grad(got, [x, wq.weight])
        want = f(x)
        ex, ew = torch.autograd.grad(want, [x, wq.weight])
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(gx, ex)
        torch.testing.assert_close(gw, ew)
    (part,) = [p for c in store for p in c.partitions.values()]
    assert part.strategy == "min_cut", part.notes
    assert not any("attention" in name for name in part.saved), part.saved


def _step_peak(model, x) -> int:
    """The most bytes of new storages alive at once during forward + backward (LiveBytes)."""
    from kiln.bench.live_bytes import LiveBytes

    with LiveBytes() as live:
        model(x).backward()
    return live.peak


def test_checkpointed_regions_save_their_outputs_and_peak_like_eager():
    """Each region's output is the next region's input: saved, as eager saves a checkpoint's
    inputs. Recomputed instead (the cut is free to recompute marked values), the backward
    rebuilt every block from the first one before any block's gradient, all alive at once: the
    checkpointed step peaked as high as the plain one."""
    torch.manual_seed(0)
    x = torch.randn(256, 64, requires_grad=True)
    peaks = {}
    for mode in (None, "non_reentrant", "reentrant"):
        torch.manual_seed(0)
        eager = Net(d=64, layers=6, mode=mode)
        torch.manual_seed(0)
        compiled = kiln.compile(Net(d=64, layers=6, mode=mode), fullgraph=True)
        for _ in range(2):  # compile, then a steady call
            compiled(x).backward()
        peaks[mode] = (_step_peak(eager, x), _step_peak(compiled, x))
    plain = peaks[None][1]
    for mode in ("non_reentrant", "reentrant"):
        eager_peak, kiln_peak = peaks[mode]
        # (the compiled backward's fused gradient kernels hold a little more than eager's:
        # 1.16x here; before, 2.6x)
        assert kiln_peak <= eager_peak * 1.25, (mode, peaks)
        assert kiln_peak * 2 < plain, (mode, peaks)
