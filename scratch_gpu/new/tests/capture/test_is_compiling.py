"""`torch.compiler.is_compiling()` is True inside code kiln compiles (as under torch.compile),
so libraries take their compile-friendly branches; outside, it stays False."""

from __future__ import annotations

import torch

import kiln


def test_torch_compiler_is_compiling_is_true_while_kiln_compiles():
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def fn(x):
        if torch.compiler.is_compiling():
            return x * 2 + 1
        return x - 1

    compiled = kiln.compile(fn, backend=counting)
    for _ in range(3):
        x = torch.randn(5)
        torch.testing.assert_close(compiled(x), x * 2 + 1)
        torch.testing.assert_close(fn(x), x - 1)  # eager: not compiling
    assert len(graphs) == 1
