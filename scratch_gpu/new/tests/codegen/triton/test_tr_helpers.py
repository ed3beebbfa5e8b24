"""The comparison the Triton tests rely on (`tr_helpers.assert_matches_eager`) can fail.

It accepts what a correct fused kernel does (a different rounding of an intermediate, within
eager's own distance from float64) and rejects what a wrong one does (an error larger than
eager's, different NaNs, a changed integer). Plain CPU tensors; no Triton needed.
"""

from __future__ import annotations

import pytest
import torch
from tr_helpers import assert_matches_eager


def _bf16_case():
    torch.manual_seed(0)
    ref = torch.randn(4096, dtype=torch.float64) * 3
    eager = ref.to(torch.bfloat16)  # eager's error: up to half a bfloat16 ulp of |ref| <= ~12
    return ref, eager


def test_one_ulp_rounding_flip_passes_against_the_reference():
    # The GPU failure in small: layer norm of a bfloat16 softmax, where kiln rounded one
    # softmax value to the neighbouring bfloat16 (a float32 ulp apart before rounding).
    torch.manual_seed(0)
    x = torch.randn(16, 2048, dtype=torch.float64)
    w, b = torch.randn(2048, dtype=torch.float64), torch.randn(2048, dtype=torch.float64)

    def ln(s):  # in float32, rounded once at the end, as eager and kiln both do
        return torch.nn.functional.layer_norm(s.float(), (2048,), w.float(), b.float())

    ref = torch.nn.functional.layer_norm(torch.softmax(x, -1), (2048,), w, b)
    s = torch.softmax(x.to(torch.bfloat16), -1)
    eager = ln(s).to(torch.bfloat16)
    i = int(eager[0].abs().argmin())  # an output near zero: the flip is a large relative change
    s_kiln = s.clone()
    s_kiln[0, i] = (s[0, i].float() * (1 + 2**-7)).to(torch.bfloat16)  # the next bfloat16
    assert s_kiln[0, i] != s[0, i]
    kiln = ln(s_kiln).to(torch.bfloat16)
    with pytest.raises(AssertionError):  # the step-1 comparison alone rejects it ...
        assert_matches_eager(kiln, eager)
    assert_matches_eager(kiln, eager, lambda: ref)  # ... float64 shows it is as good as eager


def test_error_larger_than_eagers_fails():
    ref, eager = _bf16_case()
    worst = (eager.double() - ref).abs().max().item()
    kiln = eager.clone()
    kiln[7] = (ref[7] + 10 * worst).to(torch.bfloat16)
    with pytest.raises(AssertionError, match="further from the float64 reference"):
        assert_matches_eager(kiln, eager, ref)


def test_nan_positions_must_match():
    ref, eager = _bf16_case()
    kiln = eager.clone()
    kiln[3] = float("nan")
    with pytest.raises(AssertionError):
        assert_matches_eager(kiln, eager, ref)


def test_integers_are_exact():
    a = torch.arange(10)
    assert_matches_eager(a.clone(), a, a.double())
    with pytest.raises(AssertionError):
        assert_matches_eager(a + (a == 4), a, a.double())


def test_cancelling_sum_needs_its_scale():
    torch.manual_seed(1)
    x = torch.randn(77100)
    ref = x.double().sum()
    eager = x.sum()
    other = x.view(-1, 257).sum(0).sum()  # another order, as a fused kernel may use
    scale = x.abs().sum().item()
    if not torch.equal(other, eager):
        assert_matches_eager(other, eager, ref, scale=scale)
    with pytest.raises(AssertionError):  # one term lost is far outside eps * sum|x|
        assert_matches_eager(x[1:].sum(), eager, ref, scale=scale)
