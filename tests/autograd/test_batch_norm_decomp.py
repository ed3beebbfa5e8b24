"""`native_batch_norm` (what CUDA's channels-last batch norm reaches) is decomposed in eval mode
only: there it is pointwise math and must equal the op; in training it stays whole."""

from __future__ import annotations

import pytest
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


def test_eval_batch_norm_matches_the_op_in_half_types_and_without_affine():
    decomp = default_decompositions()[aten.native_batch_norm.default]
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        x = (torch.randn(3, 5, 4, 7) * 3 + 1).to(dtype)
        mean, var = torch.randn(5).to(dtype), (torch.rand(5) + 0.2).to(dtype)
        for w, b in ((torch.randn(5).to(dtype), torch.randn(5).to(dtype)), (None, None)):
            got = decomp(x, w, b, mean, var, False, 0.1, 1e-3)
            want = aten.native_batch_norm.default(x, w, b, mean, var, False, 0.1, 1e-3)
            assert got[0].dtype == dtype
            torch.testing.assert_close(got[0], want[0])
            assert [t.shape for t in got[1:]] == [t.shape for t in want[1:]]


def test_cudnn_batch_norm_in_eval_gives_the_four_outputs_torch_does():
    from torch._decomp import decomposition_table

    if aten.cudnn_batch_norm.default not in decomposition_table:
        pytest.skip("this torch has no cudnn_batch_norm decomposition (kiln registers none)")
    ours = default_decompositions()[aten.cudnn_batch_norm.default]
    theirs = decomposition_table[aten.cudnn_batch_norm.default]
    x = torch.randn(2, 3, 4, 4)
    w, b, mean, var = torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.5
    got = ours(x, w, b, mean, var, False, 0.1, 1e-5)
    want = theirs(x, w, b, mean, var, False, 0.1, 1e-5)
    torch.testing.assert_close(got[0], want[0])
    assert [(t.shape, t.dtype) for t in got[1:]] == [(t.shape, t.dtype) for t in want[1:]]
