"""Mutated inputs written in place (schedule/inplace.py): an input changed by the graph is
written by its kernel directly, and the runtime copies nothing back, unless a read of the old
value comes after the write; results, mutated inputs and version counters are eager's.
"""

from __future__ import annotations

import io
import logging

import torch

import kiln
from kiln.backends.builtin import fallbacks


def _run_logged(fn, *args):
    """(result, mutated args, the output_code + schedule log) of one compiled call."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logger = logging.getLogger("kiln")
    logger.addHandler(handler)
    kiln.set_logs("output_code", "schedule")
    try:
        out = kiln.compile(fn)(*args)
    finally:
        kiln.set_logs()
        logger.removeHandler(handler)
    return out, buf.getvalue()


def _adam_like(p, g, m, v):
    with torch.no_grad():
        m.lerp_(g, 0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        p.add_(m / (v.sqrt() + 1e-8), alpha=-0.01)


def test_state_and_parameters_are_written_in_place_with_eager_results():
    torch.manual_seed(0)
    base = [torch.randn(37, 19), torch.randn(37, 19), torch.randn(37, 19), torch.rand(37, 19)]
    ref = [t.clone() for t in base]
    got = [t.clone() for t in base]
    versions = [t._version for t in got]
    fell_back = fallbacks()
    _adam_like(*ref)
    _, log = _run_logged(_adam_like, *got)
    for a, b in zip(ref, got):
        torch.testing.assert_close(b, a)
    assert fallbacks() == fell_back
    # p, m and v are written by the kernel itself, and nothing is copied back
    assert log.count("written into input") == 3, log
    assert [t._version > v for t, v in zip(got, versions)] == [True, False, True, True]


def test_later_calls_mutate_the_new_inputs_in_place():
    torch.manual_seed(1)
    f = kiln.compile(_adam_like)
    for _ in range(3):
        base = [torch.randn(8, 5), torch.randn(8, 5), torch.randn(8, 5), torch.rand(8, 5)]
        ref, got = [t.clone() for t in base], [t.clone() for t in base]
        _adam_like(*ref)
        f(*got)
        for a, b in zip(ref, got):
            torch.testing.assert_close(b, a)


def _old_value_read_after(a, b):
    old = a.clone()
    a.mul_(2)
    # `old` is `a` before the update, read at other elements than the update writes: in a
    # kernel after the one that computes the new `a`
    return old + a.flip(0) + b


def test_input_read_after_its_new_value_is_computed_is_copied_back():
    torch.manual_seed(2)
    a, b = torch.randn(64, 33), torch.randn(64, 33)
    ra, rb = a.clone(), b.clone()
    expected = _old_value_read_after(ra, rb)
    out, log = _run_logged(_old_value_read_after, a, b)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(a, ra)
    assert "is not written into input" in log, log


def test_input_returned_is_not_overwritten_early():
    def f(x, y):
        z = x * 1  # a copy of x's old value returned beside the mutated x
        x.add_(y)
        return z

    torch.manual_seed(3)
    x, y = torch.randn(10, 300), torch.randn(10, 300)
    rx = x.clone()
    expected = f(rx, y)
    out, _ = _run_logged(f, x, y)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, rx)


def _read_then_overwritten(x):
    y = x.clone()
    y[0] = 5  # an extern (fill) between the kernel that reads x and the one that writes it
    x.copy_(y)
    return x * 3


def test_input_read_by_an_earlier_kernel_stays_bound_until_written_into():
    # The input's last read is a kernel before the extern; the kernel after it writes the new
    # value into the input itself. The wrapper once freed the input's name after that last
    # read and then handed it to the writing kernel (UnboundLocalError on every call).
    torch.manual_seed(4)
    f = kiln.compile(_read_then_overwritten, fullgraph=True)
    for _ in range(3):
        x = torch.randn(3, 3)
        rx = x.clone()
        expected = _read_then_overwritten(rx)
        out = f(x)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(x, rx)
