"""The comparison the NumPy capture tests share: same type, dtype and values as eager's."""

import numpy as np
import torch


def assert_np_same(got, expected, path="out", *, equal_nan=True):
    """Same type (ndarray, NumPy scalar, tensor, ...), same dtype, same values (float32
    tolerances: kernels sum in their own order), through tuples, lists and dicts. Object arrays
    compare exactly; `equal_nan=False` makes a NaN on either side a difference."""
    assert type(got) is type(expected), f"{path}: type {type(got)} != {type(expected)}"
    if isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_np_same(g, e, f"{path}[{i}]", equal_nan=equal_nan)
    elif isinstance(expected, dict):
        assert list(got) == list(expected), f"{path}: keys differ"
        for k in expected:
            assert_np_same(got[k], expected[k], f"{path}[{k!r}]", equal_nan=equal_nan)
    elif isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype, f"{path}: {got.dtype} != {expected.dtype}"
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, equal_nan=equal_nan)
    elif isinstance(expected, (np.ndarray, np.generic)):
        assert got.dtype == expected.dtype, f"{path}: {got.dtype} != {expected.dtype}"
        assert np.shape(got) == np.shape(expected), f"{path}: shape differs"
        if expected.dtype.kind == "O":
            assert np.array_equal(got, expected), f"{path}: values differ"
        else:
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, equal_nan=equal_nan)
    else:  # other objects by equality (identity, for objects without __eq__)
        assert got == expected, f"{path}: {got!r} != {expected!r}"
