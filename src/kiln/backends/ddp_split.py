"""Graphs split at DistributedDataParallel's bucket boundaries, so all-reduce overlaps backward.

Takes a backend (`Backend`) and gives one that does the same, except for a graph captured
while a `DistributedDataParallel` forward runs (`kiln.compile(DDP(m))`, `DDP(kiln.compile(m))`
and a compiled function calling a DDP module alike: DDP marks itself active around its
module's call). Such a graph is cut into pieces, each holding about one DDP bucket of
parameters, and each piece is compiled by the wrapped backend as a graph of its own.

Why. DDP all-reduces a bucket of gradients as soon as its last gradient is accumulated, so
that communication overlaps the rest of the backward. One compiled graph is one autograd node:
its backward hands every parameter gradient back when it ends, every bucket becomes ready at
once and all of the all-reduce waits after the backward's compute. With one piece per bucket,
the last piece's backward ends first, its bucket is all-reduced while the earlier pieces'
backward runs, and so on (torch.compile's DDPOptimizer does the same for the same reason).

Where the cuts fall. Walking the graph from its output back (the order in which the backward
produces gradients, which is the order DDP fills its buckets in after its first step), the
bytes of the DDP parameters each node reads for the first time are added to the current piece;
once they reach the bucket cap (DDP's first-bucket cap for the first piece, `bucket_cap_mb`
after it, or the per-bucket list it was given), the next node that reads a new parameter
starts a new piece. A `getitem` stays with the node it reads from, so only tensors cross.

How pieces run. `torch.fx`'s `split_module` gives a parent graph calling one submodule a
piece; each piece is compiled on its first call, with that call's real inputs as its example
inputs (the pieces in between have no inputs of their own before the graph runs once), and
called directly after that. A graph with symbolic sizes or non-tensor inputs, or with fewer
than two pieces, is not split; every decision is logged under `KILN_LOGS=graph_breaks`, and a
split is printed by `kiln.explain` (`split:`; explain's `eager` backend splits as the others do).
`options={"optimize_ddp": False}` turns splitting off.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx

from .. import logs
from ..contracts import Backend, CaptureInfo

MB = 1024 * 1024


def active_ddp() -> torch.nn.Module | None:
    """The DistributedDataParallel module whose forward is running, or None."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # a torch built without torch.distributed
        return None
    get = getattr(DistributedDataParallel, "_get_active_ddp_module", None)
    return get() if get is not None else None


def bucket_caps(ddp: torch.nn.Module) -> list[int]:
    """DDP's bucket caps in bytes, in the order its buckets fill (the last one repeats)."""
    config = getattr(ddp, "_bucket_config", None)
    if config is not None and len(getattr(config, "per_bucket_bytes_caps", ())) > 0:
        return list(config.per_bucket_bytes_caps)
    cap = int(getattr(ddp, "bucket_bytes_cap", 25 * MB))
    first = int(getattr(config, "first_bucket_bytes_cap", cap)) if config is not None else cap
    return [first, cap]


def ddp_aware(backend: Backend) -> Backend:
    """`backend`, splitting graphs captured inside a DDP forward at its bucket boundaries."""

    def split_or_compile(
        gm: torch.fx.GraphModule, example_inputs: list, info: CaptureInfo
    ) -> Callable:
        ddp = active_ddp()
        if ddp is None or not info.options.get("optimize_ddp"):
            return backend(gm, example_inputs, info)
        return compile_split(gm, example_inputs, info, ddp, backend)

    return Backend(backend.name, split_or_compile, True)


def compile_split(
    gm: torch.fx.GraphModule,
    example_inputs: list,
    info: CaptureInfo,
    ddp: torch.nn.Module,
    backend: Backend,
) -> Callable:
    """`gm` compiled as one piece per DDP bucket (or whole, with the reason logged)."""
    from ..autograd.symbolic import symbolic_world

    ids = {id(p) for p in ddp.parameters() if p.requires_grad}
    params = {i: t for i, t in enumerate(example_inputs) if id(t) in ids}
    if symbolic_world(gm) is not None or not all(
        isinstance(t, torch.Tensor) for t in example_inputs
    ):
        why = "the graph has symbolic sizes or non-tensor inputs"
        return _whole(gm, example_inputs, info, backend, why)
    pieces = plan_pieces(gm, params, bucket_caps(ddp))
    count = max(pieces.values(), default=0) + 1
    if count < 2:
        why = f"its {len(params)} DDP parameters fit one bucket"
        return _whole(gm, example_inputs, info, backend, why)
    split = split_pieces(gm, pieces)
    sizes = [0] * count
    for pos in params:
        sizes[_counted_in(gm, pos, pieces)] += 1
    note = (
        f"{info.label}: graph split at DistributedDataParallel's bucket boundaries into {count} "
        f"pieces (DDP parameters per piece, in forward order: {sizes}; bucket caps "
        f"{_mb(bucket_caps(ddp))}), each compiled as its own graph so a bucket is all-reduced "
        "while the backward of the pieces before it runs"
    )
    logs.log("graph_breaks", note)
    return SplitGraph(split, count, backend, info, note)


def _whole(
    gm: torch.fx.GraphModule, example_inputs: list, info: CaptureInfo, backend: Backend, why: str
) -> Callable:
    logs.log("graph_breaks", f"{info.label}: not split at DDP's bucket boundaries: {why}")
    return backend(gm, example_inputs, info)


def _mb(caps: list[int]) -> str:
    return ", ".join(f"{c / MB:g} MiB" for c in caps)


def plan_pieces(
    gm: torch.fx.GraphModule, params: dict[int, torch.Tensor], caps: list[int]
) -> dict[torch.fx.Node, int]:
    """Piece of every non-placeholder node (0 first in forward order): see the module doc."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    param_nodes = {placeholders[i]: t for i, t in params.items()}
    seen: set[torch.fx.Node] = set()
    backwards: dict[torch.fx.Node, int] = {}  # piece counted from the graph's end
    piece, filled = 0, 0
    for node in reversed(gm.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        new = [p for p in node.all_input_nodes if p in param_nodes and p not in seen]
        if new and filled >= caps[min(piece, len(caps) - 1)]:
            piece, filled = piece + 1, 0
        for p in new:
            seen.add(p)
            filled += param_nodes[p].numel() * param_nodes[p].element_size()
        backwards[node] = piece
    last = piece
    pieces = {node: last - k for node, k in backwards.items()}
    for node in gm.graph.nodes:  # a getitem stays with what it reads: only tensors cross
        if node.op == "call_function" and node.target is operator.getitem:
            source = node.args[0]
            if isinstance(source, torch.fx.Node) and source in pieces:
                pieces[node] = pieces[source]
    return pieces


def _counted_in(gm: torch.fx.GraphModule, pos: int, pieces: dict) -> int:
    """The piece whose bucket input `pos` (a parameter) was counted in: the last reading it."""
    node = list(gm.graph.find_nodes(op="placeholder"))[pos]
    return max((pieces[u] for u in node.users if u in pieces), default=0)


def split_pieces(gm: torch.fx.GraphModule, pieces: dict) -> torch.fx.GraphModule:
    """The parent graph module: one submodule `submod_K` per piece, each returning a tuple."""
    import inspect

    from torch.fx.passes.split_module import split_module

    if "tuple_return" in inspect.signature(split_module).parameters:  # torch >= 2.13
        return split_module(
            gm, gm, lambda node: pieces[node], keep_original_order=True, tuple_return=True
        )
    return _tuple_outputs(split_module(gm, gm, lambda node: pieces[node], keep_original_order=True))


def _tuple_outputs(parent: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """What `split_module(..., tuple_return=True)` gives, on a torch without that argument
    (2.11, 2.12): a piece with one output returns it bare there; make it return a 1-tuple and
    read it back with a getitem in the parent, so every piece is called the same way."""
    for node in list(parent.graph.nodes):
        if node.op != "call_module":
            continue
        sub = parent.get_submodule(str(node.target))
        assert isinstance(sub, torch.fx.GraphModule)  # split_module makes graph modules
        out = next(n for n in reversed(sub.graph.nodes) if n.op == "output")
        if isinstance(out.args[0], (tuple, list)):
            continue
        out.args = ((out.args[0],),)
        sub.recompile()
        with parent.graph.inserting_after(node):
            item = parent.graph.call_function(operator.getitem, (node, 0))
        node.replace_all_uses_with(item, delete_user_cb=lambda user, item=item: user is not item)
    parent.recompile()
    return parent


class SplitGraph:
    """Runs the parent graph of a split; each piece is compiled on its first call."""

    def __init__(
        self,
        parent: torch.fx.GraphModule,
        count: int,
        backend: Backend,
        info: CaptureInfo,
        note: str,
    ) -> None:
        self.parent = parent
        self.pieces: list[_Piece] = []
        placeholders = list(parent.graph.find_nodes(op="placeholder"))
        for node in parent.graph.nodes:
            if node.op != "call_module":
                continue
            sub = parent.get_submodule(str(node.target))
            assert isinstance(sub, torch.fx.GraphModule)  # split_module makes graph modules
            # which of the piece's inputs are the graph's own inputs (parameters, checked ones)
            outer = [placeholders.index(a) if a in placeholders else -1 for a in node.args]
            piece_info = CaptureInfo(
                label=f"{info.label} [DDP bucket piece {len(self.pieces) + 1}/{count}]",
                options=info.options,
                static_inputs=tuple(k for k, i in enumerate(outer) if i in info.static_inputs),
                checked_inputs=tuple(k for k, i in enumerate(outer) if i in info.checked_inputs),
                fixed_call_key=info.fixed_call_key,
            )
            piece = _Piece(sub, backend, piece_info)
            parent.delete_submodule(str(node.target))
            setattr(parent, str(node.target), piece)
            self.pieces.append(piece)
        self.explain_notes = (note,)
        self.forward = parent.forward

    def __call__(self, *args: Any) -> Any:
        return self.forward(*args)


class _Piece:
    """One piece: compiled by the backend with the inputs of its first call."""

    def __init__(self, gm: torch.fx.GraphModule, backend: Backend, info: CaptureInfo) -> None:
        self.gm = gm
        self.backend = backend
        self.info = info
        self.compiled: Callable | None = None

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None:
            self.compiled = self.backend(self.gm, list(args), self.info)
        return self.compiled(*args)
