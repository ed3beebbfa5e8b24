"""Storage offsets: a trace that reads one is checked against it (issue 30's class, found while
fixing issue 31 on CUDA).

`storage_offset()` is a metadata read answered from the real tensor. The tensor guard checks
sizes and strides, not where a view starts in its storage, so before this fix a branch on the
offset was kept for every later input: `x * 2` for a view starting at 1 (a wrong result, with
static, automatic and dynamic shapes alike). And a dynamic input's fake has a symbolic offset of
its own; a shape fact over it (CUDA kernels' fakes check aligned access: `16*s0 + 8*s1 <= 3200`)
was written with a symbol the guard could not read, raising NameError and missing on every call
(GPT-2 in bfloat16 on an H100 recompiled on every call until the entry limit).
"""

import pytest
import torch
from harness import CountingBackend

import kiln
from kiln.capture.dynamic import DynamicShapes
from kiln.capture.sources import LocalSource


def by_offset_parity(x):
    if x.storage_offset() % 2 == 0:
        return x * 2
    return x * 3


@pytest.mark.parametrize("dynamic", [False, None, True])
def test_a_branch_on_the_storage_offset_is_guarded(dynamic):
    backend = CountingBackend()
    compiled = kiln.compile(by_offset_parity, backend=backend, dynamic=dynamic)
    base = torch.randn(400)
    for offset in (0, 1, 2, 3, 0):
        x = base[offset : offset + 50]
        torch.testing.assert_close(compiled(x), by_offset_parity(x))
    assert len(backend.graphs) == 4  # one entry per offset seen (by value)


def test_offsets_not_read_are_not_guarded():
    backend = CountingBackend()
    compiled = kiln.compile(lambda x: x.sin() * 2, backend=backend)
    base = torch.randn(400)
    for offset in (0, 1, 2):
        x = base[offset : offset + 50]
        torch.testing.assert_close(compiled(x), x.sin() * 2)
    assert len(backend.graphs) == 1


def test_every_symbol_of_a_dynamic_input_can_be_read_by_a_guard():
    """Sizes, strides and the storage offset of a dynamic input's fake: each symbol has the
    expression that reads it off the input (a shape fact over it renders to runnable code)."""
    shapes = DynamicShapes()
    base = torch.randn(4, 100)
    x = base[:, 3:40]  # a strided view that starts at 3
    fake = shapes.fake_input(x, LocalSource("x"), {0, 1})
    symbols = set()
    for v in (*fake.shape, *fake.stride(), fake.storage_offset()):
        if isinstance(v, torch.SymInt):
            symbols |= v.node.expr.free_symbols
    assert symbols and symbols <= set(shapes.names)
    text = shapes.render(fake.storage_offset().node.expr + 16 * fake.size(1).node.expr)
    assert eval(text, {"x": x}) == x.storage_offset() + 16 * x.size(1)
