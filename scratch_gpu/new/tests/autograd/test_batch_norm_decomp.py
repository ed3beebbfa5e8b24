"""`native_batch_norm` (what CUDA's channels-last batch norm reaches) is decomposed in eval mode
only: there it is pointwise math and must equal the op; in training it stays whole."""

from __future__ import annotations

import torch

from kiln.autograd.decomps import default_decompositions

aten = torch.ops.aten


def test_native_batch_norm_decomposes_in_eval_and_not_in_training():
    decomp = default_decompositions()[aten.native_batch_norm.default]
    x = torch.randn(4, 6, 5, 5).contiguous(memory_format=torch.channels_last)
    w, b, mean, var = torch.randn(6), torch.randn(6), torch.randn(6), torch.rand(6) + 0.5
    got = decomp(x, w, b, mean, var, False, 0.1, 1e-5)
    want = aten.native_batch_norm.default(x, w, b, mean, var, False, 0.1, 1e-5)
    torch.testing.assert_close(got[0], want[0])
    assert decomp(x, w, b, mean.clone(), var.clone(), True, 0.1, 1e-5) is NotImplemented
