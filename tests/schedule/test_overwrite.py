"""Kernel outputs stored over an intermediate their kernel reads for the last time
(schedule/inplace.py `overwrites`, memory.py `Alloc.over`): a pointwise kernel after a matmul
(a transformer's GELU, SiLU-times-up) writes into the matmul's buffer instead of a second one of
the same size, unless some read of that buffer could come after the store. Every test compares
with eager on the example inputs and on fresh random ones, over several calls.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

from kiln.schedule import Alloc, ExternCall

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from cg_helpers import check, fresh_like  # noqa: E402


def _over(c) -> dict[str, str]:
    return {s.name: s.over for s in c.schedule.steps if isinstance(s, Alloc) and s.over}


def _ffn(x, w1, b1, w2, b2):
    h = F.gelu(F.linear(x, w1, b1))
    return F.linear(h, w2, b2) + x


def _ffn_inputs():
    return (
        torch.randn(4, 16, 32),
        torch.randn(128, 32),
        torch.randn(128),
        torch.randn(32, 128),
        torch.randn(32),
    )


def _check_calls(c, fn, args, calls=3, tol=None):
    for _ in range(calls):
        fresh = tuple(fresh_like(a) for a in args)
        expected = pytree.tree_leaves(fn(*fresh))
        got = c(*fresh)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=tol, atol=tol)


def test_gelu_after_a_matmul_is_stored_over_the_matmul_output():
    args = _ffn_inputs()
    c = check(_ffn, *args, rtol=1e-4, atol=1e-4)  # (vector erf: last-bit differences)
    over = _over(c)
    assert len(over) == 1, c.schedule
    ((out, src),) = over.items()
    assert src.startswith("extern")  # the first linear's out= buffer
    # The kernel gets both names for one storage; the matmul's name goes after the kernel.
    src_text = c.wrapper_source
    assert f"{out} = {src}.view(" in src_text and f"del {src}\n" in src_text
    assert f"{out} = _empty(" not in src_text
    # The C++ kernel may not declare the shared storage __restrict__ twice.
    assert f"__restrict__ {src}" not in c.kernel_source
    assert f"__restrict__ {out}" not in c.kernel_source
    _check_calls(c, _ffn, args, tol=1e-4)


def test_llama_style_gate_times_up_is_stored_over_one_projection():
    def mlp(x, wg, wu, wd):
        return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)

    args = (torch.randn(2, 8, 32), torch.randn(96, 32), torch.randn(96, 32), torch.randn(32, 96))
    c = check(mlp, *args, rtol=1e-4, atol=1e-4)  # (outputs reach ~1e3: float32 sums)
    assert len(_over(c)) == 1, c.schedule
    _check_calls(c, mlp, args, tol=1e-4)


def test_a_buffer_read_again_later_is_not_stored_over():
    def fn(x, w):
        h = x @ w
        g = torch.sigmoid(h)
        return g @ w + h  # h is read after the sigmoid's kernel

    args = (torch.randn(32, 32), torch.randn(32, 32))
    c = check(fn, *args)
    assert _mm_name(c, 0) not in _over(c).values(), c.schedule
    _check_calls(c, fn, args)


def _mm_name(c, k: int) -> str:
    """The name of the k-th extern call of the schedule."""
    return [s.name for s in c.schedule.steps if isinstance(s, ExternCall)][k]


def test_a_buffer_read_at_another_element_is_not_stored_over():
    def fn(x, w):
        h = x @ w
        return (torch.sigmoid(h) + h.t()) @ w

    args = (torch.randn(32, 32), torch.randn(32, 32))
    c = check(fn, *args)
    assert _mm_name(c, 0) not in _over(c).values(), c.schedule
    _check_calls(c, fn, args)


def test_layer_norm_reading_its_input_in_a_later_pass_is_not_stored_over():
    def fn(x, w, r):
        return F.layer_norm(x @ w + r, (w.shape[1],)) @ w

    args = (torch.randn(16, 32), torch.randn(32, 32), torch.randn(16, 32))
    c = check(fn, *args)
    assert _mm_name(c, 0) not in _over(c).values(), c.schedule
    _check_calls(c, fn, args)


def test_a_returned_buffer_is_not_stored_over():
    def fn(x, w):
        h = x @ w
        return h, torch.relu(h)

    args = (torch.randn(16, 32), torch.randn(32, 32))
    c = check(fn, *args)
    assert not _over(c), c.schedule
    first = c(*args)
    expected_h = (args[0] @ args[1]).clone()
    _check_calls(c, fn, args)
    torch.testing.assert_close(first[0], expected_h)
