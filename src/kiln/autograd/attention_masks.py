"""Attention masks computed from constants: dropped when they mask nothing, made `is_causal`
when they are the causal triangle.

Takes the captured torch-level graph; rewrites its `scaled_dot_product_attention` calls in place
and returns what it did, one line a call (`KILN_LOGS=aot_graphs`).

Why: libraries build their masks differently under a compiler. transformers, seeing
`torch.compiler.is_compiling()`, cannot ask whether a mask is needed at all (that reads tensor
data), so it always builds one from `arange` comparisons; eager BERT passes no mask. A mask
closes the door on SDPA's fastest kernels (cuDNN, flash), and the math path that remains runs
the scores through float32 matrix products and a softmax: BERT-base at 8×512 spent 2.8 ms of its
4.9 ms there on an H200, against 0.23 ms for eager's cuDNN attention.

A mask is a constant when nothing in its computation reads a graph input or draws random
numbers. Such a subgraph is run once, here, on the device it names (it is small: `arange`s,
comparisons, views), and the value decides:

- a bool mask that is all True, or a float mask that is all zero: the call gets no mask;
- a bool mask equal to `ones(L, S).tril()` where it broadcasts: the call gets `is_causal=True`
  (SDPA's own meaning of `is_causal`, the top-left triangle) and no mask.

Both rewrites give the same function (adding zero, or masking what `is_causal` masks); the
numbers may differ in the last bits, as they do between SDPA's own backends.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.fx.node import map_arg

_SDPA = torch.nn.functional.scaled_dot_product_attention
_MASK_POS = 3  # (query, key, value, attn_mask, dropout_p, is_causal, ...)
_CAUSAL_POS = 5

# Calls whose values are not a function of their arguments.
_RANDOM = ("rand", "bernoulli", "dropout", "normal", "multinomial", "poisson", "uniform")
_UNINITIALISED = ("empty",)
# A constant subgraph is only run when its values hold at most this many bytes together.
_MAX_BYTES = 256 << 20


def simplify_attention_masks(gm: torch.fx.GraphModule) -> list[str]:
    """Rewrite each SDPA call whose mask is a constant that masks nothing or is causal."""
    notes: list[str] = []
    values: dict[torch.fx.Node, torch.Tensor | None] = {}  # one mask often serves every layer
    verdicts: dict[tuple, str | None] = {}  # (mask, scores' shape) -> what the mask is
    subgraphs: list[list[torch.fx.Node]] = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _SDPA:
            continue
        mask = _arg(node, _MASK_POS, "attn_mask")
        if not isinstance(mask, torch.fx.Node):
            continue
        if mask not in values:
            sub = _constant_subgraph(mask)
            values[mask] = None if sub is None else _evaluate(sub, mask)
            subgraphs.append(sub or [])
        q, k = (_example(a) for a in node.args[:2])
        if values[mask] is None or q is None or k is None:
            continue
        scores = (*q.shape[:-1], k.shape[-2])
        if (mask, scores) not in verdicts:
            verdicts[mask, scores] = _verdict(values[mask], scores)
        note = _rewrite(node, mask, verdicts[mask, scores])
        if note:
            notes.append(note)
    if notes:
        for sub in subgraphs:  # the mask's computation, where nothing reads it any more
            for n in reversed(sub):
                if not n.users and not _mutates(n):
                    gm.graph.erase_node(n)
        gm.graph.lint()
        gm.recompile()
    return notes


def _verdict(value: torch.Tensor, scores: tuple) -> str | None:
    """What a mask value is against attention scores of shape `scores`: "nothing" (it masks
    nothing), "causal" (the causal triangle) or None."""
    try:
        if torch.broadcast_shapes(tuple(value.shape), scores) != torch.Size(scores):
            return None  # the mask would widen the result: not a no-op to drop
    except RuntimeError:
        return None
    if _masks_nothing(value):
        return "nothing"
    if value.dtype == torch.bool:
        causal = torch.ones(scores[-2:], dtype=torch.bool, device=value.device).tril()
        if bool((value == causal).all()):
            return "causal"
    return None


def _rewrite(call: torch.fx.Node, mask: torch.fx.Node, verdict: str | None) -> str | None:
    where = f"scaled_dot_product_attention `{call.name}`: mask `{mask.name}`"
    if verdict == "nothing":
        _set(call, _MASK_POS, "attn_mask", None)
        return f"{where} is a constant that masks nothing: dropped"
    if verdict == "causal" and not _arg(call, _CAUSAL_POS, "is_causal", False):
        _set(call, _MASK_POS, "attn_mask", None)
        _set(call, _CAUSAL_POS, "is_causal", True)
        return f"{where} is the causal triangle: is_causal=True, mask dropped"
    return None


def _masks_nothing(value: torch.Tensor) -> bool:
    if value.dtype == torch.bool:
        return bool(value.all())
    return value.is_floating_point() and bool((value == 0).all())


def _constant_subgraph(mask: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The nodes `mask` is computed from, in graph order, if none reads an input, draws random
    numbers or is too large to run here, and nothing mutates them; else None."""
    seen: set[torch.fx.Node] = set()
    stack = [mask]
    nbytes = 0
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op not in ("call_function", "call_method") or _nondeterministic(n):
            return None
        val = _example(n)
        if isinstance(val, torch.Tensor):
            size = val.untyped_storage().nbytes()
            if not isinstance(size, int):  # symbolic: a dynamic size, not a constant
                return None
            nbytes += size
            if nbytes > _MAX_BYTES:
                return None
        stack.extend(n.all_input_nodes)
    if _mutated_later(seen):
        return None
    order = {n: i for i, n in enumerate(mask.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def _mutated_later(sub: set[torch.fx.Node]) -> bool:
    """Whether an in-place call may write into one of `sub`'s values: a call that mutates a
    value computed from them (a view is one), up to the attention calls that read the mask
    (their output is fresh)."""
    derived = set(sub)
    stack = list(sub)
    while stack:
        for u in stack.pop().users:
            if u in derived or u.op == "output" or u.target is _SDPA:
                continue
            written = u.kwargs.get("out", u.args[0] if u.args else None)
            if _mutates(u) and written in derived:
                return True
            derived.add(u)
            stack.append(u)
    return False


def _evaluate(sub: list[torch.fx.Node], mask: torch.fx.Node) -> torch.Tensor | None:
    """Run the mask's subgraph for real; None when any step fails (the call is left alone)."""
    env: dict[torch.fx.Node, object] = {}
    try:
        with torch.no_grad():
            for n in sub:
                args = map_arg(n.args, env.__getitem__)
                kwargs = map_arg(n.kwargs, env.__getitem__)
                if n.op == "call_method":
                    self_, *rest = args
                    env[n] = getattr(self_, n.target)(*rest, **kwargs)
                else:
                    env[n] = n.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - any failure only means no rewrite
        return None
    value = env[mask]
    return value if isinstance(value, torch.Tensor) else None


def _name(n: torch.fx.Node) -> str:
    t = n.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def _nondeterministic(n: torch.fx.Node) -> bool:
    name = _name(n).lower()
    return any(w in name for w in _RANDOM + _UNINITIALISED)


def _mutates(n: torch.fx.Node) -> bool:
    name = _name(n)
    in_place = name.endswith("_") and not name.endswith("__")
    return in_place or "out" in n.kwargs or name in ("__setitem__", "setitem")


def _example(n) -> torch.Tensor | None:
    if not isinstance(n, torch.fx.Node):
        return None
    val = n.meta.get("example_value", n.meta.get("val"))
    return val if isinstance(val, torch.Tensor) else None


def _arg(node: torch.fx.Node, pos: int, name: str, default=None):
    if len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(name, default)


def _set(node: torch.fx.Node, pos: int, name: str, value) -> None:
    if len(node.args) > pos:
        node.update_arg(pos, value)
    else:
        node.update_kwarg(name, value)
