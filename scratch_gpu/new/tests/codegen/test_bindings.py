"""codegen/bindings.py: every fast binding dispatches to the very overload it replaces."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.codegen.bindings import BINDINGS, fast_binding, fast_externs

_aten = torch.ops.aten


class _Record(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _m(*size):
    return torch.randn(*size, device="meta")


def _samples():
    """Arguments for each table entry, spelled the way the wrapper spells them: positional in
    schema order, keyword-only ones by name (`out=`, `scale=`)."""
    x, w, b = _m(8, 4), _m(4, 6), _m(6)
    q = torch.randn(2, 3, 16, 8, device="meta", dtype=torch.float16)
    s = {
        _aten.convolution.default: (
            (_m(2, 3, 8, 8), _m(4, 3, 3, 3), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
            {},
        ),  # fmt: skip
        _aten.mm.default: ((x, w), {}),
        _aten.mm.out: ((x, w), {"out": _m(8, 6)}),
        _aten.addmm.default: ((b, x, w), {}),
        _aten.addmm.out: ((b, x, w), {"out": _m(8, 6)}),
        _aten.bmm.default: ((_m(2, 8, 4), _m(2, 4, 6)), {}),
        _aten.bmm.out: ((_m(2, 8, 4), _m(2, 4, 6)), {"out": _m(2, 8, 6)}),
        _aten.baddbmm.default: ((_m(2, 8, 6), _m(2, 8, 4), _m(2, 4, 6)), {"beta": 0.5}),
        _aten.baddbmm.out: ((_m(2, 8, 6), _m(2, 8, 4), _m(2, 4, 6)), {"out": _m(2, 8, 6)}),
        _aten.max_pool2d_with_indices.default: ((_m(2, 3, 8, 8), [3, 3], [2, 2], [1, 1]), {}),
        _aten.embedding.default: (
            (_m(10, 4), torch.zeros(3, dtype=torch.int64, device="meta")),
            {},
        ),  # fmt: skip
        _aten.cumsum.default: ((_m(4, 5), -1), {}),
    }
    attention = {
        "_scaled_dot_product_cudnn_attention": ((q, q, q, None, False, 0.0, True), {"scale": 0.3}),
        "_scaled_dot_product_flash_attention": ((q, q, q, 0.0, True), {"scale": 0.3}),
        "_scaled_dot_product_efficient_attention": ((q, q, q, None, False, 0.0, True), {}),
    }
    for name, sample in attention.items():
        if hasattr(_aten, name):
            s[getattr(_aten, name).default] = sample
    return s


SAMPLES = _samples()


@pytest.mark.parametrize("op", list(BINDINGS), ids=str)
def test_binding_dispatches_to_the_same_overload(op):
    assert op in SAMPLES, f"no sample arguments for {op}: add one to _samples()"
    args, kwargs = SAMPLES[op]
    with _Record() as rec:
        BINDINGS[op](*args, **kwargs)
    assert rec.ops and rec.ops[0] == op, f"{BINDINGS[op]} dispatched to {rec.ops}, not {op}"


def test_bindings_compute_what_the_overloads_compute():
    x, w, b = torch.randn(8, 4), torch.randn(4, 6), torch.randn(6)
    img, k = torch.randn(2, 3, 9, 9), torch.randn(4, 3, 3, 3)
    cases = [
        (_aten.addmm.default, (b, x, w)),
        (_aten.convolution.default, (img, k, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1)),
        (_aten.max_pool2d_with_indices.default, (img, [3, 3], [2, 2], [1, 1])),
        (_aten.cumsum.default, (x, 0)),
    ]
    for op, args in cases:
        want, got = op(*args), fast_binding(op)(*args)
        for a, b_ in zip(*(t if isinstance(t, tuple) else (t,) for t in (want, got))):
            torch.testing.assert_close(b_, a, rtol=0, atol=0)


def test_other_overloads_stay_as_they_are():
    externs = {"aten_sort_default": _aten.sort.default, "aten_mm_default": _aten.mm.default}
    fast = fast_externs(externs)
    assert fast["aten_sort_default"] is _aten.sort.default
    assert fast["aten_mm_default"] is torch._C._VariableFunctions.mm
