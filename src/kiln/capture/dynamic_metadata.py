"""Metadata reads of tensors with symbolic sizes: answers that stay true for every call.

Takes a metadata call the recorder answers instead of recording (`x.size(1)`, `x.stride()`,
`x.nbytes`, `a.is_same_size(b)`, `x.is_contiguous(memory_format=...)`) whose tensor has a fake
with symbolic sizes (capture/dynamic.py); gives the answer the trace may keep using:

* a number that depends on a symbolic size (a size, a stride of a contiguous input, a numel, a
  byte count) is a symbolic int (capture/symbolic.py) backed by a graph node, so arithmetic on it
  is recorded and a comparison guards only its outcome;
* a yes/no answer that depends on symbolic sizes is computed on the fakes, which adds the shape
  facts it relied on (`s0 == s1`) to the entry's guards.

Why: answering with the first call's plain number bakes that number into the graph without a
guard, and a later call of another size silently computes with the old one (`x.as_strided(
(n, m), (x.stride(0), 1))` read a stride of 20 at every length).
Returns None where the plain answer is right for every call the entry's guards admit.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from .symbolic import _Sym
from .symbolic import make as make_sym

# Yes/no reads that depend on sizes: computed on the fakes (their shape facts become guards).
_SIZE_PREDICATES = ("is_same_size", "is_contiguous")


def symbolic_metadata(tracer, name: str, args: tuple, kwargs: dict) -> Any:
    """The answer to metadata read `name` of `args[0]` (a tensor) under symbolic sizes, or None
    when the plain answer holds for every admitted call."""
    t = args[0]
    fake = tracer.dyn.fakes.get(id(t))
    if fake is None:
        return None
    if name in ("size", "shape"):
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if dim is not None:
            return sym_dim(tracer, t, fake, dim)
        return _size_tuple(t, [sym_dim(tracer, t, fake, d) for d in range(t.dim())])
    if name == "stride":
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if dim is not None:
            return _sym_stride(tracer, t, fake, dim)
        strides = tuple(_sym_stride(tracer, t, fake, d) for d in range(t.dim()))
        return strides if any(isinstance(s, _Sym) for s in strides) else t.stride()
    if name == "__len__" and t.dim() > 0:
        return sym_dim(tracer, t, fake, 0)
    if name in ("numel", "nelement", "nbytes"):
        n = _sym_numel(tracer, t, fake)
        if n is None:
            return None
        return n * t.element_size() if name == "nbytes" else n
    if name in _SIZE_PREDICATES:
        return _size_predicate(tracer, name, args, kwargs)
    return None


def sym_dim(tracer, t: torch.Tensor, fake, d: int):
    d = d % t.dim() if t.dim() else d
    return _sym_read(tracer, t, fake.size(d), "size", d, int(t.size(d)))


def _sym_stride(tracer, t: torch.Tensor, fake, d: int):
    d = d % t.dim() if t.dim() else d
    return _sym_read(tracer, t, fake.stride(d), "stride", d, int(t.stride(d)))


def _sym_read(tracer, t: torch.Tensor, fake_value, method: str, d: int, real: int):
    """A symbolic int for `t.<method>(d)` when its fake value is symbolic, else the number."""
    symbolic, expr = tracer.dyn.symbolic(fake_value)
    if not symbolic:
        return real
    key = (id(t), d) if method == "size" else (id(t), d, method)
    node = tracer._size_nodes.get(key)
    if node is None:
        node = tracer._size_nodes[key] = tracer.graph.call_method(method, (tracer.node_of(t), d))
    return make_sym(tracer, real, node, expr, fake_value)


def _sym_numel(tracer, t: torch.Tensor, fake):
    n = fake.numel()
    symbolic, expr = tracer.dyn.symbolic(n)
    if not symbolic:
        return None
    node: fx.Node = tracer.graph.call_method("numel", (tracer.node_of(t),))
    return make_sym(tracer, t.numel(), node, expr, n)


def _size_tuple(t: torch.Tensor, dims: list):
    # a torch.Size, as eager gives, holding the symbolic sizes
    return torch.Size(dims) if any(isinstance(d, _Sym) for d in dims) else t.shape


def _size_predicate(tracer, name: str, args: tuple, kwargs: dict) -> bool:
    """`a.is_same_size(b)` / `x.is_contiguous(...)` computed on the fakes: evaluating the
    symbolic comparison records the shape fact it relied on, so the entry is only reused by
    calls for which the answer is the same."""
    real = getattr(torch.Tensor, name)(*args, **kwargs)
    fakes = [tracer.dyn.fake_of(a) if isinstance(a, torch.Tensor) else a for a in args]
    with torch._C.DisableTorchFunction(), tracer.dyn.fake_mode:
        bool(getattr(torch.Tensor, name)(*fakes, **kwargs))  # records the facts used
    return real
