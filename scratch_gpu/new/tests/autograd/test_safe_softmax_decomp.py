"""`_safe_softmax` (what scaled-dot-product attention with a mask decomposes to) is broken up
into `_softmax`, an all-reduction and a where: a fully masked row gives zeros, as the op does,
and the whole masked softmax compiles into kernels with no ATen call left."""

from __future__ import annotations

import logging

import torch

import kiln
from kiln.autograd.decomps import default_decompositions

aten = torch.ops.aten


def _scores():
    x = torch.randn(2, 3, 8, 16)
    x[0, 1, 2, :] = float("-inf")  # a fully masked row: zeros, not NaN
    x[1, 0, :, 5:] = float("-inf")
    return x


def test_decomposition_equals_the_op():
    decomp = default_decompositions()[aten._safe_softmax.default]
    for _ in range(3):
        x = _scores()
        torch.testing.assert_close(decomp(x, -1), aten._safe_softmax.default(x, -1))


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_masked_attention_softmax_compiles_without_extern_calls():
    def f(scores, mask, scale: float = 0.125):
        return aten._safe_softmax.default(scores * scale + mask, -1)

    compiled = kiln.compile(f)
    keep = _Keep()
    logging.getLogger("kiln").addHandler(keep)
    kiln.set_logs("output_code")
    try:
        for _ in range(2):
            scores, mask = torch.randn(2, 3, 8, 16), torch.zeros(2, 1, 8, 16)
            mask[0, :, 2, :] = float("-inf")
            mask[1, :, :, 9:] = float("-inf")
            got = compiled(scores, mask)
            torch.testing.assert_close(got, f(scores, mask))
            assert torch.equal(got[0, :, 2], torch.zeros_like(got[0, :, 2]))
    finally:
        kiln.set_logs()
        logging.getLogger("kiln").removeHandler(keep)
    code = "\n".join(m for m in keep.messages if "def call" in m)
    assert "def call" in code and "aten_" not in code, code
