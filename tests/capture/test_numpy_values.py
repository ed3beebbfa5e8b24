"""NumPy inside compiled code: a NumPy call kiln does not model runs natively between graphs (a
graph break with its reason), and a NumPy value from outside the trace read by Python code is
guarded by value, so a later call with other data never reuses a value baked in from the traced
call (capture/numpy_values.py). Modelled NumPy work is traced: tests/capture/test_numpy_trace.py.
Fresh random data every call; compared with eager."""

import numpy as np
import torch

import kiln


def scale_by_numpy_max(x):
    y = x * 2
    a = y.numpy()
    m = float(np.abs(a).max())
    return y / m + 1


def numpy_round_trip(x):
    y = x * 2
    a = y.numpy()
    b = np.sin(np.sort(a)) + a.sum()  # np.sort is not modelled: a break
    return torch.from_numpy(b) * 2 + y


def test_value_read_after_numpy_calls_is_not_baked_in():
    cf = kiln.compile(scale_by_numpy_max)
    for _ in range(5):
        x = torch.randn(6)
        torch.testing.assert_close(cf(x), scale_by_numpy_max(x))


def test_numpy_round_trip_matches_eager_and_says_why():
    cf = kiln.compile(numpy_round_trip)
    for _ in range(4):
        x = torch.randn(6)
        torch.testing.assert_close(cf(x), numpy_round_trip(x))
    out = kiln.explain(numpy_round_trip)(torch.randn(6))
    assert out.graph_break_count >= 1
    assert any("numpy" in reason.lower() for reason, _, _ in out.breaks)


def test_numpy_argument_changed_in_place_between_calls():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(4).astype(np.float32)

    def f(x, arr):
        s = arr.sum()
        return x * float(s) + float(arr[1])

    cf = kiln.compile(f)
    for _ in range(4):
        a[:] = rng.standard_normal(4)  # same array object, new contents
        x = torch.randn(3)
        torch.testing.assert_close(cf(x, a), f(x, a))
