"""Helpers for codegen tests: trace a function to ATen, compile it, compare with eager.

`check(fn, *example_inputs)` traces `fn` with `make_fx`, compiles it with
`kiln.codegen.compile_graph_strict`, then draws *fresh* random inputs of the same shapes,
dtypes and strides and compares the compiled outputs with eager `fn` on them. It returns the
`CompiledGraph` so a test can also assert on the generated code.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from kiln.codegen import compile_graph_strict


def trace_dynamic(fn, example, dynamic: dict | None = None):
    """`fn` traced with every size symbolic (`dynamic` None), or on fake tensors whose dims
    `dynamic[k]` of input k are symbolic and the rest static (as kiln's AOT autograd traces a
    captured graph with one dynamic length)."""
    if dynamic is None:
        return make_fx(fn, tracing_mode="symbolic")(*example)
    mode = FakeTensorMode(shape_env=ShapeEnv())

    def fake(k, t):
        dims = [
            DimDynamic.DYNAMIC if d in dynamic.get(k, ()) else DimDynamic.STATIC
            for d in range(t.dim())
        ]
        return mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims))

    fakes = [fake(k, t) for k, t in enumerate(example)]
    with mode:
        return make_fx(fn, tracing_mode="fake")(*fakes)


def fresh_like(t: torch.Tensor) -> torch.Tensor:
    """A new random tensor with `t`'s shape, dtype and strides (never zeros)."""
    if t.dtype == torch.bool:
        base = torch.rand(t.shape) > 0.5
    elif t.dtype.is_floating_point:
        base = torch.randn(t.shape, dtype=torch.float64).to(t.dtype)
    else:
        base = (
            torch.randint(-9, 10, t.shape).to(t.dtype)
            if t.dtype != torch.uint8
            else (torch.randint(0, 20, t.shape).to(t.dtype))
        )
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    out.copy_(base)
    return out


def trace(fn, *inputs):
    return make_fx(fn)(*inputs)


def check(fn, *inputs, rtol=None, atol=None, fresh=True, options=None, inputs_fn=None):
    gm = trace(fn, *inputs)
    compiled = compile_graph_strict(gm, inputs, options=options)
    runs = [inputs]
    if fresh:
        runs.append(tuple(inputs_fn() if inputs_fn else [fresh_like(x) for x in inputs]))
    for args in runs:
        expected = pytree.tree_leaves(fn(*args))
        got = compiled(*args)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            if isinstance(e, torch.Tensor):
                assert g.dtype == e.dtype, (g.dtype, e.dtype)
                assert g.shape == e.shape, (g.shape, e.shape)
                torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True)
            else:
                assert g == e
    return compiled
