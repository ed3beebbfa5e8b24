"""NumPy arrays handed to a compiled function from outside (arguments, items of argument
lists/tuples/dicts, object attributes, globals) are graph inputs: a `torch.from_numpy` view of
the caller's array on every call, guarded like a tensor input (type, dtype, sizes under the
dynamic-shape policy, strides), not by contents (capture/numpy_values.py `lift`,
numpy_trace.py `lift_input`). New data of the same shape reuses the compiled graph; in-place
changes reach the caller's array; arrays torch cannot share keep the guard by contents, with
the reason logged. Every call runs on fresh random data and is compared with eager."""

import logging

import numpy as np
import pytest
import torch
from harness import CountingBackend
from np_helpers import assert_np_same

import kiln
from kiln.capture.errors import Unsupported

RNG = np.random.default_rng(0)


def _array(shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(1, 50, size=shape).astype(dtype)
    return (RNG.standard_normal(shape) * 3).astype(dtype)


def _copy(v):
    if isinstance(v, (np.ndarray, torch.Tensor)):
        return v.copy() if isinstance(v, np.ndarray) else v.clone()
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_copy(x) for x in v)
    return v


def _check(cf, fn, args):
    """Compiled and eager on the same fresh data: results, and the arguments afterwards."""
    eager_args = _copy(args)
    expected = fn(*eager_args)
    got = cf(*args)
    assert_np_same(got, expected, equal_nan=False)
    assert_np_same(list(args), list(eager_args), "args after the call", equal_nan=False)
    return got


def _entries(cf) -> int:
    return len(cf._kiln_compiled.entries)


# ---- one compile serves new data ---------------------------------------------------------------
def numpy_and_torch(a, x):
    b = np.tanh(a) * 2 + a.mean(axis=0)
    return torch.from_numpy(b) + x, b.sum(axis=1)


@pytest.mark.parametrize("backend", ["inductor", "counting"])
def test_ten_arrays_of_one_shape_compile_once(backend):
    counting = CountingBackend()
    cf = kiln.compile(
        numpy_and_torch, fullgraph=True, backend=counting if backend == "counting" else "inductor"
    )
    for _ in range(10):
        _check(cf, numpy_and_torch, (_array((5, 3), np.float64), torch.randn(3)))
    assert _entries(cf) == 1
    if backend == "counting":
        assert len(counting.graphs) == 1 and counting.runs == 9
        placeholders = [n.name for n in counting.graphs[0].graph.nodes if n.op == "placeholder"]
        assert len(placeholders) == 2, placeholders  # the array is an input, not a constant


def only_numpy(a):
    return np.sin(a) * a - a.max()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8])
def test_numeric_dtypes_are_inputs_and_results_keep_eagers_dtype(dtype):
    backend = CountingBackend()
    cf = kiln.compile(only_numpy, backend=backend, fullgraph=True)
    for _ in range(4):
        _check(cf, only_numpy, (_array((4, 6), dtype),))
    assert len(backend.graphs) == 1


def test_shape_change_recompiles_as_for_tensors_then_dims_are_dynamic():
    backend = CountingBackend()
    cf = kiln.compile(only_numpy, backend=backend, fullgraph=True)
    for rows in (4, 4, 5, 6, 7):
        _check(cf, only_numpy, (_array((rows, 3)),))
    assert len(backend.graphs) == 2  # (4, 3); then (*, 3) for every other row count
    _check(cf, only_numpy, (_array((5, 3), np.float64),))  # another dtype: another graph
    assert len(backend.graphs) == 3
    _check(cf, only_numpy, (_array((5, 3, 2)),))  # another rank: another graph
    assert len(backend.graphs) == 4


def test_dynamic_false_compiles_per_shape_and_strided_arrays_keep_their_layout():
    backend = CountingBackend()
    cf = kiln.compile(only_numpy, backend=backend, fullgraph=True, dynamic=False)
    for rows in (4, 5, 4):
        _check(cf, only_numpy, (_array((rows, 3)),))
    assert len(backend.graphs) == 2
    for _ in range(2):  # a strided view: its own entry, then reused
        _check(cf, only_numpy, (_array((4, 6))[:, ::2],))
    assert len(backend.graphs) == 3


# ---- writes reach the caller -------------------------------------------------------------------
def write_into(a, x):
    a += 1.5
    a[0] = x.sum().numpy()
    a[-1] *= 2
    return torch.from_numpy(a) * x


@pytest.mark.parametrize("backend", ["inductor", "counting"])
def test_in_place_writes_reach_the_callers_array(backend):
    cf = kiln.compile(
        write_into, fullgraph=True, backend=CountingBackend() if backend == "counting" else backend
    )
    for _ in range(4):
        a = _array((6,))
        before = a.copy()
        _check(cf, write_into, (a, torch.randn(6)))  # compares `a` with eager's after the call
        assert not np.array_equal(a, before)
    assert _entries(cf) == 1


def returns_its_argument(a):
    a *= 3
    return a


def test_returned_argument_is_the_callers_object():
    cf = kiln.compile(returns_its_argument, fullgraph=True)
    for _ in range(3):
        a = _array((3, 2))
        expected = a * 3
        assert cf(a) is a
        np.testing.assert_allclose(a, expected, rtol=1e-6)
    assert _entries(cf) == 1


# ---- arrays inside containers, on objects, as globals ------------------------------------------
class Holder:
    pass


def nested(batch, holder):
    w, (b,) = batch["w"], batch["extra"]
    return np.tanh(w) @ holder.m + b.sum(axis=0), torch.from_numpy(holder.m).sum(0)


def test_arrays_in_a_dict_a_tuple_and_on_an_object_attribute():
    backend = CountingBackend()
    cf = kiln.compile(nested, backend=backend, fullgraph=True)
    for _ in range(5):
        holder = Holder()
        holder.m = _array((3, 4), np.float64)
        batch = {"w": _array((2, 3), np.float64), "extra": (_array((6, 4)),)}
        _check(cf, nested, (batch, holder))
    assert len(backend.graphs) == 1


TABLE = _array((4,), np.float64)


def reads_global(x):
    return x * torch.from_numpy(TABLE)


def test_global_array_is_an_input_and_its_new_contents_are_read():
    backend = CountingBackend()
    cf = kiln.compile(reads_global, backend=backend, fullgraph=True)
    for _ in range(4):
        TABLE[:] = RNG.standard_normal(4)  # new contents, same array
        _check(cf, reads_global, (torch.randn(4, dtype=torch.float64),))
    assert len(backend.graphs) == 1


def zero_d(a, x):
    return x * torch.from_numpy(a) + 1, a * 2, np.sqrt(np.abs(a))


def test_zero_dimensional_array():
    backend = CountingBackend()
    cf = kiln.compile(zero_d, backend=backend, fullgraph=True)
    for _ in range(4):
        _check(cf, zero_d, (np.array(RNG.standard_normal()), torch.randn(3, dtype=torch.float64)))
    assert len(backend.graphs) == 1


# ---- data read in Python, and arrays torch cannot share ---------------------------------------
def reads_data(a, x):
    y = x * 2
    if a.sum() > 0:  # Python reads the array's data: a graph break, resumed after it
        return y + torch.from_numpy(a)
    return y - 1


def test_reading_an_arguments_data_breaks_and_stays_right():
    cf = kiln.compile(reads_data)
    for _ in range(6):
        _check(cf, reads_data, (_array((3,)), torch.randn(3)))
    assert cf._kiln_compiled.eager_reason is None
    with pytest.raises(Unsupported, match="data"):
        kiln.compile(reads_data, fullgraph=True)(_array((3,)), torch.randn(3))


def _read_only(shape):
    a = _array(shape)
    a.flags.writeable = False
    return a


UNSHARED = {
    "read-only": (_read_only, "read-only"),
    "big-endian": (lambda s: _array(s).astype(">f4"), "byte order"),
    "object dtype": (lambda s: _array(s).astype(object), "object"),
    "negative strides": (lambda s: _array(s)[::-1], "negative"),
}


def scale(a, x):
    return x * float(a.sum()) + len(a)


def _logged(artifact: str, run) -> list[str]:
    """The messages of `KILN_LOGS=<artifact>` while `run()` runs."""
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())  # type: ignore[method-assign]
    logging.getLogger("kiln").addHandler(handler)
    kiln.set_logs(artifact)
    try:
        run()
    finally:
        kiln.set_logs()
        logging.getLogger("kiln").removeHandler(handler)
    return records


@pytest.mark.parametrize("kind", list(UNSHARED))
def test_arrays_torch_cannot_share_are_guarded_by_contents_and_say_why(kind):
    make, why = UNSHARED[kind]
    cf = kiln.compile(scale)

    def calls():
        for _ in range(3):
            _check(cf, scale, (make((5,)), torch.randn(4)))

    records = _logged("perf_hints", calls)
    assert cf._kiln_compiled.eager_reason is None
    hints = [r for r in records if "guarded by its contents" in r]
    assert hints and why in hints[0], records
    assert _entries(cf) == 3  # new contents: a new entry each call


def test_a_shareable_array_after_a_read_only_one_is_an_input_again():
    cf = kiln.compile(scale)
    _check(cf, scale, (_read_only((4,)), torch.randn(3)))
    for _ in range(3):
        _check(cf, scale, (_array((4,)), torch.randn(3)))
    assert _entries(cf) == 2  # by contents; then one entry, the array an input
    _check(cf, scale, (_read_only((4,)), torch.randn(3)))  # fails the input's guard
    assert _entries(cf) == 3
    assert cf._kiln_compiled.eager_reason is None


def test_recompile_reason_names_the_array_fact_that_changed():
    cf = kiln.compile(only_numpy, backend=CountingBackend(), fullgraph=True)
    _check(cf, only_numpy, (_array((4, 3)),))
    records = _logged("recompiles", lambda: _check(cf, only_numpy, (_array((4, 3), np.float64),)))
    assert any("L['a'].dtype: == dtype('float32') -- now dtype('float64')" in r for r in records)
    read_only = kiln.compile(scale)
    _check(read_only, scale, (_array((4,)), torch.randn(2)))
    records = _logged(
        "recompiles", lambda: _check(read_only, scale, (_read_only((4,)), torch.randn(2)))
    )
    assert any("L['a'].flags.behaved: is True (writeable" in r for r in records), records
