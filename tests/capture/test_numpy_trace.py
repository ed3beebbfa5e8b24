"""NumPy work on arrays made from traced tensors is traced as tensor operations
(capture/numpy_trace.py, numpy_ops.py): `t.numpy()`, ufuncs, operators, reductions, shape
functions, indexing, attributes, astype, NumPy scalars and `torch.from_numpy` compile into one
graph (fullgraph=True, so a break fails the test) with NumPy's dtypes; returned arrays are real
ndarrays of eager's type and dtype; in-place changes of an array change the tensor it shares
memory with; what is not modelled is one clean break that names the NumPy function. Every
test compares with eager on fresh random data, over several calls (the later ones run the
compiled graph)."""

import numpy as np
import pytest
import torch
from harness import CountingBackend
from np_helpers import assert_np_same

import kiln

DTYPES = [torch.float32, torch.float64, torch.int64]


def _data(dtype, *shape):
    x = torch.randn(*shape) * 4
    if dtype.is_floating_point:
        return x.to(dtype)
    x = x.round().to(dtype)
    return torch.where(x == 0, torch.ones_like(x), x)  # nonzero: divisions stay defined


def run(fn, make_args, *, graphs=1, calls=3, fullgraph=True):
    backend = CountingBackend()
    cf = kiln.compile(fn, backend=backend, fullgraph=fullgraph)
    for _ in range(calls):
        args = make_args()
        eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        expected = fn(*eager_args)
        got = cf(*args)
        assert_np_same(got, expected)
        assert_np_same(list(args), eager_args, "args after the call")
    assert len(backend.graphs) == graphs, f"{len(backend.graphs)} graphs"
    assert cf._kiln_compiled.eager_reason is None, cf._kiln_compiled.eager_reason
    assert backend.runs >= calls - graphs
    return cf, backend


# ---- the issue's example and ufuncs ------------------------------------------------------------
def issue_example(x):
    a = x.numpy()
    b = np.sin(a) + a.sum(axis=0)
    return torch.from_numpy(b) * 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_issue_example_is_one_graph(dtype):
    run(issue_example, lambda: (_data(dtype, 3, 4),))


def ufuncs(x, y):
    a, b = x.numpy(), y.numpy()
    c = np.exp(a / 8) + np.log(np.abs(b) + 1) - np.sqrt(np.abs(a))
    d = np.maximum(a, b) * np.minimum(a, 0.5) + np.tanh(b)
    e = np.where(a > b, a, b * 2) + np.clip(a, -1, 1)
    return c, d, e, np.square(a), np.negative(b), np.isfinite(c), np.floor(a)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ufuncs_have_numpy_dtypes(dtype):
    run(ufuncs, lambda: (_data(dtype, 4, 5), _data(dtype, 4, 5)))


def operators(x, y):
    a, b = x.numpy(), y.numpy()
    return (
        a + 1,  # a Python int is weak: the array's dtype stays
        a * 2.5,  # int64 * float -> float64; float32 * float stays float32
        a / b,  # int / int -> float64
        a // b,  # floor division: numpy's (and Python's) signs
        a % b,
        -a,
        a**2,
        3 - a,
        a < b,
        a == b,
        (a >= 0) & (b < 0),
        a @ b.T,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_operators_follow_numpy_promotion_and_signs(dtype):
    run(operators, lambda: (_data(dtype, 3, 3), _data(dtype, 3, 3)))


def mixed_dtypes(x, i):
    a, n = x.numpy(), i.numpy()
    return a + n, n / 2, a * np.float32(2), np.float64(1.5) * a


def test_mixed_dtype_promotion():
    run(mixed_dtypes, lambda: (_data(torch.float32, 6), _data(torch.int64, 6)))


# ---- reductions --------------------------------------------------------------------------------
def reductions(x):
    a = x.numpy()
    return (
        np.sum(a),
        np.sum(a, axis=0),
        a.sum(axis=1, keepdims=True),
        np.mean(a),
        a.mean(axis=(0, 1)),
        np.max(a, axis=1),
        a.min(),
        np.argmax(a),
        a.argmin(axis=0),
        np.std(a, axis=0),
        a.var(ddof=1),
        np.prod(a[:, :2], axis=1),
        np.amax(a, axis=None, keepdims=True),
        np.any(a > 1, axis=1),
        (a > -100).all(),
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions_with_numpy_argument_names_and_dtypes(dtype):
    run(reductions, lambda: (_data(dtype, 4, 5),))


def int32_sum(x):
    a = x.numpy()
    return a.sum(), np.mean(a), a.sum(axis=0, dtype=np.float32)


def test_int32_sum_is_int64_and_mean_float64():
    run(int32_sum, lambda: (_data(torch.int64, 4, 3).to(torch.int32),))


# ---- shapes, indexing, attributes, conversions -------------------------------------------------
def shapes(x):
    a = x.numpy()
    b = a.reshape(3, 4).T
    c = np.concatenate([a.reshape(-1), b.reshape(12)])
    d = np.stack([a, a * 2], axis=1)
    e = np.expand_dims(a, 0)
    f = np.squeeze(e, axis=0)
    return b, c, d, e, f, np.transpose(d, (2, 0, 1)), a.ravel(), a.flatten()


@pytest.mark.parametrize("dtype", DTYPES)
def test_shape_functions(dtype):
    run(shapes, lambda: (_data(dtype, 2, 6),))


def indexing(x, idx):
    a, i = x.numpy(), idx.numpy()
    return a[0], a[1:, ::2], a[:, -1], a[i], a[..., None], a[[0, 2], 1], a[1, 2], a[i, 0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_indexing(dtype):
    run(indexing, lambda: (_data(dtype, 4, 5), torch.randint(0, 4, (3,))))


def mask_indexing(x):
    a = x.numpy()
    return a[a > 0] * 2


def test_boolean_mask_indexing_is_right():
    # the result's size depends on the data: compiled or broken, never wrong
    cf = kiln.compile(mask_indexing)
    for _ in range(4):
        x = torch.randn(7)
        assert_np_same(cf(x), mask_indexing(x))


def attributes(x):
    a = x.numpy()
    n = a.shape[0] * a.ndim + a.size
    return a.astype(np.float64) * n, a.astype(np.int32), str(a.dtype), np.float32(a[0, 0]), len(a)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attributes_astype_and_scalars(dtype):
    run(attributes, lambda: (_data(dtype, 3, 2),))


def conversions(x):
    a = np.asarray(x * 2)
    b = np.array(x)
    b += 1  # a copy: x does not change
    c = x.detach().cpu().numpy()
    return torch.as_tensor(a + b), torch.tensor(c), torch.from_numpy(b).float(), a.dtype == c.dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_asarray_array_detach_cpu_and_as_tensor(dtype):
    run(conversions, lambda: (_data(dtype, 5),))


def returns_arrays(x):
    a = x.numpy()
    return a * 2, a.mean(), (a > 0).sum(), a


@pytest.mark.parametrize("dtype", DTYPES)
def test_returned_arrays_are_ndarrays_of_eager_dtype(dtype):
    run(returns_arrays, lambda: (_data(dtype, 6),))


def test_returned_array_shares_memory_with_the_input_as_in_eager():
    cf = kiln.compile(lambda x: x.numpy(), fullgraph=True)
    for _ in range(3):
        x = torch.randn(4)
        a = cf(x)
        assert type(a) is np.ndarray and a.dtype == np.float32
        a[0] = 100.0
        assert x[0].item() == 100.0


# ---- in-place changes --------------------------------------------------------------------------
def in_place(x):
    a = x.numpy()
    a += 1
    a[0] = 5
    a[1:3] *= 2
    return x * 3


@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_change_of_the_array_changes_the_tensor(dtype):
    run(in_place, lambda: (_data(dtype, 6),))


def in_place_intermediate(x):
    y = x * 2
    a = y.numpy()
    a -= a.mean()
    return y, a


def test_in_place_on_an_intermediate():
    run(in_place_intermediate, lambda: (_data(torch.float64, 3, 4),))


def in_place_casting_error(x):
    a = x.numpy()
    a += 1.5  # numpy refuses: float64 into int64 under same_kind casting
    return a


def test_in_place_casting_error_is_eagers():
    x = _data(torch.int64, 3)
    with pytest.raises(Exception) as eager:
        in_place_casting_error(x.clone())
    with pytest.raises(type(eager.value)):
        kiln.compile(in_place_casting_error)(x.clone())


# ---- escapes, data reads, breaks, errors -------------------------------------------------------
class Holder:
    pass


def stored_on_object(x, holder):
    a = x.numpy() * 2
    holder.arr = a
    return x + 1


def test_array_stored_on_an_outside_object_is_a_real_array():
    cf = kiln.compile(stored_on_object, fullgraph=True)
    for _ in range(3):
        x = torch.randn(4)
        h_e, h_c = Holder(), Holder()
        stored_on_object(x, h_e)
        cf(x, h_c)
        assert_np_same(h_c.arr, h_e.arr)


def data_read(x):
    a = (x * 2).numpy()
    s = float(a.sum())  # a Python float out of the array's data: a break
    return x / s


def test_reading_the_data_in_python_breaks_and_is_right():
    cf = kiln.compile(data_read)
    for _ in range(4):
        x = torch.rand(5) + 0.5
        torch.testing.assert_close(cf(x), data_read(x))
    with pytest.raises(Exception, match="graph break"):
        kiln.compile(data_read, fullgraph=True)(torch.rand(5) + 0.5)


def branch_on_array(x):
    a = x.numpy()
    if (a > 0).any():
        return x + 1
    return x - 1


def test_branch_on_array_breaks_and_is_right():
    cf = kiln.compile(branch_on_array)
    for sign in (1, -1, 1, -1):
        x = (torch.rand(4) + 0.1) * sign
        torch.testing.assert_close(cf(x), branch_on_array(x))


def unmodelled(x):
    a = (x + 1).numpy()
    b = np.sort(a)  # not modelled: one clean break
    return torch.from_numpy(b * 2) + x


def test_unmodelled_numpy_call_is_one_clean_break_naming_it():
    backend = CountingBackend()
    cf = kiln.compile(unmodelled, backend=backend)
    for _ in range(4):
        x = torch.randn(6)
        torch.testing.assert_close(cf(x), unmodelled(x))
    # the array the break step made enters the continuation as a graph input, not a constant
    # guarded by its contents: two graphs serve every call, none is traced again
    assert len(backend.graphs) == 2 and backend.runs == 6  # (the first call traces)
    out = kiln.explain(unmodelled)(torch.randn(6))
    assert out.graph_break_count == 1
    assert any("numpy.sort" in reason for reason, _, _ in out.breaks), out.breaks
    with pytest.raises(Exception, match="numpy.sort"):
        kiln.compile(unmodelled, fullgraph=True)(torch.randn(6))


def needs_grad(x):
    return x.numpy() * 2


def test_numpy_of_a_tensor_that_requires_grad_raises_eagers_error():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError) as eager:
        needs_grad(x)
    with pytest.raises(RuntimeError) as compiled:
        kiln.compile(needs_grad)(x)
    assert str(compiled.value) == str(eager.value)


def iterate_rows(x):
    total = x.numpy()[0] * 0
    for row in x.numpy():
        total = total + row * 2
    return total


def test_iterating_an_array_gives_traced_rows():
    run(iterate_rows, lambda: (_data(torch.float32, 3, 4),))


def index_a_list(x, table):
    a = x.numpy()
    return table[a.argmax()] * x


def test_indexing_a_python_list_with_an_array_value_is_a_break():
    cf = kiln.compile(index_a_list)
    table = [1.0, 2.0, 3.0, 4.0, 5.0]
    for _ in range(4):
        x = torch.randn(5)
        torch.testing.assert_close(cf(x, table), index_a_list(x, table))


def out_store(x):
    a = x.numpy()
    np.add(a, 1, out=a)  # not modelled: breaks before NumPy runs it, so it runs once
    return x * 2


def shuffled(x):
    a = (x * 1).numpy()
    np.random.shuffle(a)
    return torch.from_numpy(a) + 1


@pytest.mark.parametrize("fn", [out_store, shuffled])
def test_unmodelled_in_place_numpy_calls_run_once(fn):
    cf = kiln.compile(fn)
    for seed in range(3):
        x = torch.randn(8)
        x_e = x.clone()
        np.random.seed(seed)
        expected = fn(x_e)
        np.random.seed(seed)
        got = cf(x)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(x, x_e)


def dynamic_sizes(x):
    a = x.numpy()
    b = np.sin(a) + a.sum(axis=0) / a.shape[0]  # a size is a weak Python int: float32 stays
    return torch.from_numpy(b) * 2, a.reshape(-1)[: len(a)].mean(), a.T


def test_dynamic_sizes_stay_symbolic_and_dtypes_stay_numpys():
    backend = CountingBackend()
    cf = kiln.compile(dynamic_sizes, backend=backend, dynamic=True, fullgraph=True)
    for n in (3, 5, 7, 4):
        x = torch.randn(n, 4)
        assert_np_same(cf(x), dynamic_sizes(x.clone()))
    assert len(backend.graphs) == 1  # one graph serves every size
