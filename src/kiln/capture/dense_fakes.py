"""Fakes with symbolic sizes for inputs that own their storage: dense, offset 0, nothing beyond.

Takes a real input tensor, the dimensions that are dynamic, the shape environment and fake mode
of capture (capture/dynamic.py) and a name for the input; gives a fake tensor whose sizes are
fresh symbols in those dimensions, whose strides are the products of sizes the real tensor's
layout has (contiguous, channels-last, any dense permutation), whose storage offset is 0 and
whose storage is exactly its symbolic extent -- or None when the input is not such a tensor.

Why not `FakeTensorMode.from_tensor` for these: it gives the input a symbolic storage offset and
then installs a storage of the first call's byte count with `set_`, whose bounds check (a guard
on CUDA fakes) records `8*offset + 64*s0 <= 12800`: a fact that pins the entry to sizes up to the
first dynamic call's. HF GPT-2 serving on CUDA made a new entry for every length, and Llama's
decode loop one for every token. A fresh `empty_strided` over symbolic sizes has a storage that
grows with them. Views, inputs at an offset and inputs sharing or overhanging their storage keep
`from_tensor`'s fake: their storage is not theirs to size.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import DimDynamic


def dense_layout_order(t: torch.Tensor) -> list[int] | None:
    """The dimensions of `t` from innermost to outermost when its strides are exactly the
    products of the sizes inside them (a dense layout), else None."""
    order = sorted(range(t.dim()), key=lambda d: (t.stride(d), t.size(d)))
    expected = 1
    for d in order:
        if t.stride(d) != expected:
            return None
        expected *= t.size(d)
    return order


def owned_dense_fake(t: torch.Tensor, dims: set[int], shape_env, fake_mode, name_source):
    """A fake of `t` with symbols for the sizes in `dims` and a storage of its own symbolic
    extent, or None (see the module doc). `name_source(d)` gives the shape environment's
    source for dimension `d`."""
    if t.numel() == 0 or t._is_view() or t.storage_offset() != 0 or t.grad_fn is not None:
        return None
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        return None
    order = dense_layout_order(t)
    if order is None:
        return None
    sizes: list = []
    for d in range(t.dim()):
        n = int(t.size(d))
        if d not in dims:
            sizes.append(n)
            continue
        src = name_source(d)
        sym = shape_env.create_symbol(n, src, dynamic_dim=DimDynamic.DYNAMIC)
        sizes.append(shape_env.create_symintnode(sym, hint=n, source=src))
    strides: list = [0] * t.dim()
    inner = 1
    for d in order:
        strides[d] = inner
        inner = inner * sizes[d]
    with fake_mode:
        fake = torch.empty_strided(sizes, strides, dtype=t.dtype, device=t.device)
    return fake.requires_grad_(t.requires_grad)
