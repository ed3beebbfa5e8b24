"""Pad a large matmul's output width to the GPU's 16-byte alignment.

Takes an ATen graph with `val` metadata; rewrites it in place. `mm(a, b)` whose output row
length N is not a multiple of 16 bytes' worth of elements (GPT-2's 50257-token vocabulary)
makes cuBLAS fall back to slow, unaligned kernels: on the H200 the GPT-2 (8 x 512) language-model
head took 3.3 ms in such a kernel, 60% of the whole forward. Here it becomes
`mm(a, pad(b))[:, :N]`: `b` gets zero columns up to the alignment (one memory-bound copy, fused
by kiln's code generator), the product is computed at the aligned width and the result is a
view of its first N columns. `addmm`'s bias is padded the same way.

Only products large enough for the copy to pay off are padded (`MIN_WORK` multiply-adds and
at least `MIN_ROWS` rows: a decode step's one-row product stays as it is); a symbolic size is
judged at its hint (the size first seen), as lower/symbolic.py's rule says for speed decisions.
If the graph's metadata cannot be recomputed with the view (a later op needs the result
contiguous), the rewrite is undone and the graph compiles as before.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from . import rewrite
from .meta import ensure_meta, fake_call

aten = torch.ops.aten
MIN_WORK = 1 << 30  # multiply-adds
MIN_ROWS = 64
_TARGETS = (aten.mm.default, aten.addmm.default)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_PAD = aten.constant_pad_nd.default


@rewrite("pad_matmuls")
def pad_matmuls(gm: torch.fx.GraphModule, example_inputs, devices=("cuda",)) -> int:
    """Pad GPU matmuls whose output rows are not 16-byte aligned (module doc); gives how many."""
    ensure_meta(gm, example_inputs)
    done = []
    for node in list(gm.graph.nodes):
        pad = _padding(node, devices)
        if pad:
            done.append(_rewrite(gm.graph, node, pad))
    if not done:
        return 0
    try:
        _repropagate(gm)
    except Exception:  # noqa: BLE001 - a later op needs the product contiguous: keep it whole
        for item in done:
            _undo(gm.graph, *item)
        _repropagate(gm)
        return 0
    gm.recompile()
    return len(done)


def _repropagate(gm: torch.fx.GraphModule) -> None:
    """Fake values for the nodes a rewrite added (they have none) and every node downstream of
    them (their strides may change); raises what an op raises on its new inputs. Their inputs'
    values are re-made in one fake mode (a traced graph's values each carry their own).
    Re-running the whole graph instead cost GPT-2's compile 1.6 s on the H200 host, mostly
    faking its weights again."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    refaked: dict = {}
    dirty: set = set()
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if "val" in n.meta and not any(a in dirty for a in n.all_input_nodes):
            continue
        dirty.add(n)
        fake_call(n, mode, refaked)


def _padding(node, devices) -> int:
    if node.op != "call_function" or node.target not in _TARGETS or node.kwargs:
        return 0
    val = node.meta.get("val")
    b = node.args[-1].meta.get("val") if isinstance(node.args[-1], torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or b is None or val.dim() != 2:
        return 0
    if val.device.type not in devices or val.dtype not in _DTYPES:
        return 0
    (m, n), k = (_hint(s) for s in val.shape), _hint(b.shape[0])
    align = 16 // val.element_size()
    if n % align == 0 or m < MIN_ROWS or m * n * k < MIN_WORK:
        return 0
    return -n % align


def _hint(size) -> int:
    """A size, or a symbolic one at the sizes first seen. Padding is only a speed decision (the
    result is the same either way), so a symbolic size is not compared as itself: that would add
    shape guards (`8*s0 >= 64`) that made every shorter length, a decode step's, trace again."""
    if isinstance(size, torch.SymInt):
        first = size.node.hint
        return int(first) if first is not None else 0  # (unbacked: no hint, no padding)
    return int(size)


def _rewrite(graph: torch.fx.Graph, node, pad: int):
    n = node.meta["val"].shape[1]
    args = list(node.args)
    with graph.inserting_before(node):
        args[-1] = _pad_columns(graph, args[-1], pad)
        if node.target is aten.addmm.default:
            bias = args[0]
            bval = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
            if isinstance(bval, torch.Tensor) and bval.dim() >= 1 and bval.shape[-1] == n:
                args[0] = graph.call_function(_PAD, (bias, [0, pad]))
        wide = graph.call_function(node.target, tuple(args))
        narrow = graph.call_function(aten.slice.Tensor, (wide, 1, 0, n))
    node.replace_all_uses_with(narrow)
    graph.erase_node(node)
    return narrow, wide


def _pad_columns(graph: torch.fx.Graph, b, pad: int):
    """`b` [K, N] padded to [K, N + pad]. A transposed weight (`w.t()`, w [N, K] row-major:
    a linear layer's) is padded as `w` with more rows, then transposed: a contiguous copy,
    not a transposing one (GPT-2's head: 261 us as a transpose on the H200)."""
    if b.op == "call_function" and b.target is aten.t.default:
        rows = graph.call_function(_PAD, (b.args[0], [0, 0, 0, pad]))
        return graph.call_function(aten.t.default, (rows,))
    return graph.call_function(_PAD, (b, [0, pad]))


def _undo(graph: torch.fx.Graph, narrow, wide) -> None:
    made = []  # the nodes _rewrite added in front of `wide`, outermost first
    args = []
    with graph.inserting_before(narrow):
        for a in wide.args:
            if _is(a, aten.t.default) and _is(a.args[0], _PAD):
                made += [a, a.args[0]]
                a = graph.call_function(aten.t.default, (a.args[0].args[0],))
            elif _is(a, _PAD):
                made.append(a)
                a = a.args[0]
            args.append(a)
        whole = graph.call_function(wide.target, tuple(args))
    narrow.replace_all_uses_with(whole)
    graph.erase_node(narrow)
    graph.erase_node(wide)
    for n in made:
        graph.erase_node(n)


def _is(node, target) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target
