"""NumPy arrays made from traced tensors: traced as tensor operations.

Takes what the interpreter meets on a NumPy array that a traced tensor backs (`t.numpy()`,
`np.asarray(t)`, and every array computed from those): NumPy calls and array methods,
operators, indexing and index stores, attribute loads, and the places where Python reads an
array's data. Gives real NumPy values, computed by recorded torch calls on the backing tensors
(numpy_ops.py), so the graph holds the NumPy work and later calls run it compiled.

The arrays stay real `np.ndarray`s (scalars real `np.generic`s) whose memory is the backing
tensor's (`tensor.numpy()`, as eager's `t.numpy()` shares `t`'s): code kiln does not model sees
eager's objects, and an in-place change is a recorded in-place op on the backing tensor, which
changes the array too. Each call runs in NumPy as well, on the real values: NumPy's result
gives the dtype (NEP 50 promotion, int sums as int64, int means as float64) and raises what
eager raises; the torch result must then match it in shape, dtype, values and memory sharing,
or the call is a graph break (never a wrong result). What is not modelled, and every read of an
array's data into Python (`float(a)`, `if a.any():`, `print(a)`), is a graph break that names
the call; the array is a real one there, so the plain-Python step runs it as eager does.

Arrays from outside the trace (arguments, globals, attributes, container items, live values
at a break) whose memory torch can share enter the graph as inputs (`lift_input`): each call
fetches `torch.from_numpy` of the caller's array, guarded like a tensor input (type, dtype,
sizes under the dynamic-shape policy, strides; and writeable and aligned, which sharing
needs), not by contents; an in-place change is an input mutation, which reaches the
caller's array. Arrays torch cannot share are guarded by
value (numpy_values.py). An array made inside the trace needs no guard: it is a function of
the graph's inputs, and what NumPy's run reveals (dtypes, shapes) follows from theirs.

A traced array that leaves the trace (returned, stored, live at a break) is rebuilt by the
residual program as `tensor.numpy()` of the graph output that backs it (`numpy_of`).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import torch

try:
    import numpy as np
except ImportError:  # kiln runs without NumPy: no array can then be made, nor reach a hook
    np = None  # type: ignore[assignment]

from . import guards as G
from . import numpy_ops as ops
from .sources import AttrSource, Namer, Source
from .symbolic import _Sym

PASS = object()  # "not a traced NumPy call: go on as usual"
_HINT = "keep the values in tensors, or move this code out of the compiled function"


def traced(tracer, value) -> torch.Tensor | None:
    """The tensor backing `value` if it is a traced array or scalar, else None."""
    entry = tracer.np_traced.get(id(value))
    return entry[1] if entry is not None and entry[0] is value else None


def has_traced(tracer, values, depth: int = 0) -> bool:
    table = tracer.np_traced
    for v in values:
        if id(v) in table:
            return True
        if depth < 1 and type(v) in (list, tuple) and has_traced(tracer, v, depth + 1):
            return True
    return False


def numpy_of(t: torch.Tensor, scalar: bool):
    """The residual's rebuild of a traced array (`scalar`: a NumPy scalar) from its tensor."""
    arr = t.numpy()
    return arr[()] if scalar else arr


def rebuild_parts(tracer, value) -> tuple[torch.Tensor, bool] | None:
    """(backing tensor, is a scalar) of a traced value, for the residual's `numpy_of`."""
    entry = tracer.np_traced.get(id(value))
    if entry is None or entry[0] is not value:
        return None
    return entry[1], isinstance(value, np.generic)


def tensor_of_numpy(value) -> torch.Tensor | None:
    """The tensor over a NumPy value's memory (a 0-d copy for a scalar); None for anything
    else, which fails the tensor guard that follows. (An array's guard before it, `_shared`,
    has checked that torch may share it: writeable and aligned.)"""
    if not isinstance(value, (np.ndarray, np.generic)):
        return None
    try:
        return torch.from_numpy(np.asarray(value))
    except (TypeError, ValueError):
        return None


def unshared(value) -> str | None:
    """Why a graph cannot take the NumPy value `value` as a tensor over its memory (None when
    it can): an ndarray subclass (its own methods and attributes), a read-only array (torch
    would write where NumPy promised no one does), a misaligned one (kernels assume aligned
    elements), or one `torch.from_numpy` refuses (object, string or non-native byte order
    dtypes, negative strides)."""
    if type(value) is not np.ndarray and not isinstance(value, np.generic):
        return f"{type(value).__name__} is a subclass of ndarray"
    if isinstance(value, np.ndarray):
        if not value.flags.writeable:
            return "it is read-only"
        if not value.flags.aligned:
            return "its elements are not aligned in memory"
    try:
        with torch._C.DisableTorchFunction():
            torch.from_numpy(np.asarray(value))
    except (TypeError, ValueError) as e:
        return f"torch.from_numpy refuses it: {str(e).split('. ')[0]}"
    return None


@dataclass(frozen=True, eq=False)
class NumpyTensorSource(Source):
    """The tensor over the memory of the NumPy value at `base` (`tensor_of_numpy`)."""

    base: Source

    def describe(self) -> str:
        return f"torch.from_numpy({self.base.describe()})"

    def expr(self, namer: Namer) -> str:
        # one fixed name, whatever the namer has named before: shape facts over this input's
        # sizes are written while tracing, with a namer of their own (dynamic.py)
        return f"{namer.bind('___np_tensor', tensor_of_numpy)}({self.base.expr(namer)})"


def lift_input(tracer, value, source: Source) -> bool:
    """A NumPy array from outside the trace (or a NumPy scalar live at a graph break) enters
    the graph as an input: the tensor over its memory, guarded by type, dtype, shape and
    strides like a tensor (not by contents), and traced from there on. False for a value that
    has no shared tensor form (`unshared`), which is guarded by value (numpy_values.py)."""
    if type(value) is not np.ndarray and not isinstance(value, np.generic):
        return False
    if isinstance(value, np.ndarray) and not value.flags.behaved:
        return False
    with torch._C.DisableTorchFunction():
        t = tensor_of_numpy(value)
    if t is None:
        return False
    for g in _shared(source, value) if type(value) is np.ndarray else [G.type_guard(source, value)]:
        tracer.guards.add(g)
    tracer.track(t, NumpyTensorSource(source))
    tracer.sources[id(value)] = (value, source)  # rebuilt as itself
    tracer.np_traced[id(value)] = (value, t)
    return True


def _shared(source: Source, arr) -> list[G.Guard]:
    """An array input's guards before its tensor's: an ndarray, of this dtype, whose memory
    torch may share (writeable, aligned). A later array that is not fails here, naming the
    fact, and the trace that follows guards it by value (numpy_values.py)."""
    held = {"d": arr.dtype}
    dtype = G.Guard(AttrSource(source, "dtype"), "NUMPY", "{s} == {d}", held, f"== {arr.dtype!r}")
    text = "is True (writeable and aligned: torch shares the array's memory as a graph input)"
    flags = AttrSource(AttrSource(source, "flags"), "behaved")
    return [G.type_guard(source, arr), dtype, G.Guard(flags, "NUMPY", "{s}", {}, text)]


# ---- making traced values ------------------------------------------------------------------
def _register(tracer, t: torch.Tensor, scalar: bool):
    if scalar:
        with torch._C.DisableTorchFunction():
            view = t._is_view()
        if view:  # a later store into the array it views must not change the scalar
            t = t.clone()  # (recorded)
    with torch._C.DisableTorchFunction():
        value = t.numpy()[()] if scalar else t.numpy()
    tracer.np_traced[id(value)] = (value, t)
    return value


def from_tensor(interp, t: torch.Tensor, args: tuple, kwargs: dict):
    """`t.numpy()` of a traced tensor: the real array (eager's errors for a tensor that
    requires grad or is not on the CPU), backed by `t` itself."""
    with torch._C.DisableTorchFunction():
        arr = t.numpy(*args, **kwargs)
    if args or kwargs:
        return _break(interp.tracer, "Tensor.numpy(force=...)", arr)
    interp.tracer.np_traced[id(arr)] = (arr, t)
    return arr


# ---- the generic step: NumPy on real values, torch in the graph, compared ------------------
def _to_torch(tracer, x, depth: int = 0):
    """Arguments for a model: traced arrays as their tensors, other NumPy values as constant
    tensors (guarded by value where they came in), containers one level deep."""
    t = traced(tracer, x)
    if t is not None:
        return t
    if isinstance(x, (np.ndarray, np.generic)):
        with torch._C.DisableTorchFunction():
            return torch.from_numpy(np.array(x))
    if depth < 1 and type(x) in (list, tuple):
        return type(x)(_to_torch(tracer, v, depth + 1) for v in x)
    return x


def _torch_dtype(dt: np.dtype) -> torch.dtype:
    return _DTYPES(np.dtype(dt))


@functools.lru_cache(maxsize=64)
def _DTYPES(dt: np.dtype) -> torch.dtype:
    try:
        return torch.from_numpy(np.empty(0, dtype=dt)).dtype
    except TypeError:
        raise ops.Unmodelled(f"NumPy dtype {dt} has no torch dtype") from None


def _matches(tracer, r: torch.Tensor, expected, inputs: tuple) -> str | None:
    """Why torch's result `r` is not NumPy's `expected` (None when it is)."""
    with torch._C.DisableTorchFunction():
        got = r.numpy()
        exp = np.asarray(expected)
        if got.shape != exp.shape or got.dtype != exp.dtype:
            return f"kiln's model gives {got.dtype}{list(got.shape)}, NumPy {exp.dtype}"
        if exp.dtype.kind in "fc":
            tol = 1e-6 if exp.dtype.itemsize >= 8 else 1e-3
            ok = np.allclose(got, exp, rtol=tol, atol=tol, equal_nan=True)
        else:
            ok = np.array_equal(got, exp)
        if not ok:
            return "kiln's model gives other values than NumPy"
        if isinstance(expected, np.ndarray):  # a view in NumPy must be one in the graph
            for x in inputs:
                if isinstance(x, np.ndarray) and np.may_share_memory(expected, x):
                    src = traced(tracer, x)
                    if src is None or not _same_storage(r, src):
                        return "NumPy's result is a view the model does not make"
    return None


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _finish(tracer, r, expected, inputs: tuple, label: str):
    """Register torch's `r` as the result NumPy gave as `expected`, or break if they differ."""
    if not isinstance(r, torch.Tensor):
        return _break(tracer, label, expected, "its model gives no tensor")
    if isinstance(expected, np.ndarray):
        with torch._C.DisableTorchFunction():
            shared = any(
                traced(tracer, x) is not None and _same_storage(r, traced(tracer, x))
                for x in inputs
                if isinstance(x, np.ndarray)
            )
            copy = shared and not any(
                isinstance(x, np.ndarray) and np.may_share_memory(expected, x) for x in inputs
            )
        if copy:  # NumPy copied where torch made a view: a store into one must not show
            r = r.clone()
    elif not isinstance(expected, np.generic):
        return _break(tracer, label, expected, f"it gives a {type(expected).__name__}")
    why = _matches(tracer, r, expected, inputs)
    if why is not None:
        return _break(tracer, label, expected, why)
    return _register(tracer, r, isinstance(expected, np.generic))


def _break(tracer, label: str, value, why: str = "it is not modelled"):
    """A graph break for `label` (raises where the break can resume; the caller's step then
    runs the call natively); else the trace goes on concretely with `value`."""
    tracer.graph_break(f"NumPy: {label} ({why})", _HINT)
    return value


def _run(tracer, label: str, native, model, args: tuple, kwargs: dict):
    """Run `native()` (NumPy, real values: eager's result or eager's error), then `model(targs,
    tkwargs, od)` on the torch side; the registered result, or a break."""
    inputs = tuple(_flat(args)) + tuple(_flat(tuple(kwargs.values())))
    if not tracer.recording:
        return native()
    try:
        expected = native()
    except Exception:
        raise  # eager raises the same
    if not isinstance(expected, (np.ndarray, np.generic)):
        return _break(tracer, label, expected, f"it gives a {type(expected).__name__}")
    if any(expected is x for x in inputs) and traced(tracer, expected) is not None:
        return expected  # NumPy handed back its argument (`a.astype(a.dtype, copy=False)`)
    try:
        od = _torch_dtype(expected.dtype)
        targs = tuple(_to_torch(tracer, a) for a in args)
        tkw = {k: _to_torch(tracer, v) for k, v in kwargs.items()}
        if "dtype" in tkw and tkw["dtype"] is not None:
            tkw["dtype"] = od
        r = model(targs, tkw, od, expected)
    except ops.Unmodelled as e:
        return _break(tracer, label, expected, str(e))
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        return _break(tracer, label, expected, f"torch: {type(e).__name__}: {str(e)[:80]}")
    if not tracer.recording:  # a break inside the model's own torch calls
        return expected
    return _finish(tracer, r, expected, inputs, label)


def _real(x, depth: int = 0):
    """`x` as NumPy's own run sees it: symbolic sizes as the plain ints they hold (unguarded:
    that run only gives this call's dtypes and values; the graph gets the symbols), so a size
    stays a weak Python int in NumPy's promotion."""
    if isinstance(x, _Sym):
        return x._plain()
    if type(x) is slice:
        return slice(_real(x.start), _real(x.stop), _real(x.step))
    if depth < 2 and type(x) in (list, tuple):
        return type(x)(_real(v, depth + 1) for v in x)
    return x


def _flat(values: tuple):
    for v in values:
        if type(v) in (list, tuple):
            yield from v
        else:
            yield v


def _compute_dtype(name: str, args: tuple, expected) -> torch.dtype:
    if name in ops.PREDICATES:
        return _torch_dtype(np.result_type(*[_dtype_probe(a) for a in args]))
    return _torch_dtype(expected.dtype)


def _dtype_probe(a):
    """An operand as np.result_type should see it: arrays by dtype, Python numbers as weak."""
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype
    return a


# ---- entry points (the interpreter's hooks) -------------------------------------------------
def call(interp, fn, args: tuple, kwargs: dict, inlined):
    """A call whose arguments hold a traced array, or a NumPy function given a tensor: modelled,
    a graph break, or PASS (user code, containers: the interpreter goes on as usual).
    `inlined(function)`: does the interpreter run this Python function (calls.py decides)?"""
    tracer = interp.tracer
    owner = getattr(fn, "__self__", None)
    if owner is not None and traced(tracer, owner) is not None and _is_array_method(fn):
        return _method(interp, owner, fn, args, kwargs)
    if _is_numpy_callable(fn):
        if args and isinstance(args[0], torch.Tensor) and _name(fn) in ("asarray", "array"):
            return _from_tensor_call(interp, fn, args, kwargs)
        if not has_traced(tracer, args) and not has_traced(tracer, tuple(kwargs.values())):
            return PASS
        return _numpy_function(interp, fn, args, kwargs)
    if not tracer.np_traced:
        return PASS
    if not has_traced(tracer, args) and not has_traced(tracer, tuple(kwargs.values())):
        return PASS
    if _member(fn, _TORCH_FROM):
        return _to_tensor(interp, fn, args, kwargs)
    single = len(args) == 1 and not kwargs and traced(tracer, args[0]) is not None
    if fn is len and single:
        return len(args[0]) if args[0].ndim == 0 else _sym_len(interp, args[0])
    if fn is abs and single:
        return unary(interp, operator.abs, args[0])
    if _passes(fn, args, inlined):
        return PASS
    return _break(tracer, _describe(fn), PASS, "it reads the array's data in Python")


def _sym_len(interp, arr):
    t = traced(interp.tracer, arr)
    return t.shape[0] if t is not None else len(arr)


def _passes(fn, args: tuple, inlined) -> bool:
    """Calls that only hold or look at arrays: user code (run on the interpreter), containers
    and their methods, type queries."""
    import types

    if type(fn) is types.MethodType:
        fn = fn.__func__
    if type(fn) is types.FunctionType:  # run on the interpreter, not natively
        return inlined(fn)
    if type(fn) is functools.partial:
        return True  # (its function's call comes here again)
    if isinstance(fn, torch.nn.Module):
        return True
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, (list, dict, set, tuple)) and not isinstance(owner, type):
        return True
    if _member(fn, _QUERIES):
        return True
    container = _member(fn, _CONTAINERS)
    if container or isinstance(fn, type) and fn.__flags__ & (1 << 9):
        top = args[:1] if container else ()
        return not any(isinstance(a, (np.ndarray, np.generic)) for a in top)
    return False


_QUERIES = {isinstance, type, id, callable, getattr, hasattr, issubclass}
_CONTAINERS = {list, tuple, dict, set, frozenset, enumerate, zip, reversed, iter}


def _member(fn, group) -> bool:
    try:
        return fn in group
    except TypeError:  # unhashable
        return False


def _describe(fn) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    mod = getattr(fn, "__module__", None)
    return f"{mod}.{name}" if mod and mod != "builtins" else f"{name}()"


def _is_numpy_callable(fn) -> bool:
    if type(fn) is np.ufunc:
        return True
    if isinstance(fn, type):
        return issubclass(fn, np.generic)
    mod = getattr(fn, "__module__", None)
    return type(mod) is str and (mod == "numpy" or mod.startswith("numpy."))


def _is_array_method(fn) -> bool:
    return getattr(fn, "__name__", None) is not None and not isinstance(fn, type)


def _name(fn) -> str:
    return getattr(fn, "__name__", "") or ""


def _from_tensor_call(interp, fn, args: tuple, kwargs: dict):
    """np.asarray(t) / np.array(t) of a traced tensor: t.numpy() (a copy for np.array)."""
    tracer = interp.tracer
    t = args[0]
    if len(args) > 1 or set(kwargs) - {"dtype", "copy"}:
        return _break(tracer, f"numpy.{_name(fn)} of a tensor", fn(*args, **kwargs))
    with torch._C.DisableTorchFunction():
        expected = fn(*args, **kwargs)  # eager's errors (a tensor that requires grad...)
    try:
        od = _torch_dtype(expected.dtype)
    except ops.Unmodelled as e:
        return _break(tracer, f"numpy.{_name(fn)} of a tensor", expected, str(e))
    r = t.to(od)
    if _name(fn) == "array" and kwargs.get("copy", True) and r is t:
        r = t.clone()
    return _register(tracer, r, False)


def _numpy_function(interp, fn, args: tuple, kwargs: dict):
    name = _name(fn)
    label = f"numpy.{name}"
    tracer = interp.tracer
    # What is not modelled breaks before NumPy runs it here (an `out=` store, a shuffle): the
    # plain-Python step after the break runs it, once.
    if kwargs.get("out") is not None or "where" in kwargs:
        return _break(tracer, label, PASS, "with out= or where=")
    if type(fn) is np.ufunc:
        name = ops.ALIASES.get(name, name)
        if len(args) != fn.nin or name not in ops.UNARY and name not in ops.BINARY:
            return _break(tracer, label, PASS)

        def model(targs, tkw, od, expected):
            cd = _compute_dtype(name, args, expected)
            return ops.ufunc(name, targs, tkw, od, cd)

        return _run(
            tracer, label, lambda: fn(*_real(args), **_real_kw(kwargs)), model, args, kwargs
        )
    if isinstance(fn, type):  # np.float32(a): a conversion
        if len(args) != 1 or kwargs:
            return _break(tracer, label, PASS)
        return _run(
            tracer,
            label,
            lambda: fn(*args),
            lambda targs, tkw, od, e: ops._conversion(targs, {}, od, False),
            args,
            {},
        )

    def model(targs, tkw, od, expected):
        return ops.call(name, targs, tkw, od, method=False)

    if getattr(fn, "__module__", None) != "numpy" or not ops.modelled(name):
        return _break(tracer, label, PASS)  # (np.linalg, np.random, np.sort...)
    if name in ("asarray", "asanyarray") and args and traced(tracer, args[0]) is not None:
        if not kwargs or kwargs == {"dtype": None}:
            return args[0]  # the same object, as NumPy returns it
    return _run(tracer, label, lambda: fn(*_real(args), **_real_kw(kwargs)), model, args, kwargs)


def _real_kw(kwargs: dict) -> dict:
    return {k: _real(v) for k, v in kwargs.items()} if kwargs else kwargs


def _method(interp, arr, fn, args: tuple, kwargs: dict):
    name = _name(fn)
    tracer = interp.tracer
    label = f"ndarray.{name}"
    if name in _DATA_METHODS:
        return _break(tracer, label, PASS, "it reads the array's data in Python")
    if kwargs.get("out") is not None or not ops.modelled(name):
        return _break(tracer, label, PASS)  # before NumPy runs it (an in-place `a.sort()`)

    def model(targs, tkw, od, expected):
        return ops.call(name, targs, tkw, od, method=True)

    native = lambda: fn(*_real(args), **_real_kw(kwargs))  # noqa: E731
    return _run(tracer, label, native, model, (arr, *args), kwargs)


_DATA_METHODS = {"item", "tolist", "tobytes", "tofile", "dump", "dumps", "__array__"}


def _to_tensor(interp, fn, args: tuple, kwargs: dict):
    """torch.from_numpy(a) / torch.as_tensor(a) / torch.tensor(a) of a traced array."""
    tracer = interp.tracer
    t = traced(tracer, args[0]) if args else None
    if t is None or len(args) > 1 or set(kwargs) - {"dtype", "device"}:
        return _break(tracer, _describe(fn), PASS, "of this form it is not modelled")
    if kwargs.get("device") not in (None, "cpu", torch.device("cpu")):
        return _break(tracer, _describe(fn), PASS, "to another device it is not modelled")
    if isinstance(args[0], np.generic) and fn is torch.from_numpy:
        return _break(tracer, _describe(fn), PASS, "of a NumPy scalar")
    dtype = kwargs.get("dtype")
    if fn is torch.tensor:
        out = t.clone()
        return out.to(dtype) if dtype is not None else out
    if dtype is not None and dtype != t.dtype:
        return t.to(dtype)  # (a copy in eager too)
    return t.view_as(t)  # a new tensor over the same memory, as torch.from_numpy gives


_TORCH_FROM = {torch.from_numpy, torch.as_tensor, torch.asarray, torch.tensor}


def binary(interp, fn, lhs, rhs):
    """`lhs <op> rhs` where an operand is traced (fn: operator.add, operator.iadd, ...)."""
    tracer = interp.tracer
    if isinstance(lhs, torch.Tensor) or isinstance(rhs, torch.Tensor):
        return PASS  # torch's own operator (a NumPy argument there is the recorder's break)
    base = ops.INPLACE.get(fn)
    if base is not None:
        return _inplace(interp, fn, base, lhs, rhs)
    name = ops.OPERATORS.get(fn)
    if name is None or not _operand(lhs) or not _operand(rhs):
        return _break(tracer, f"operator {getattr(fn, '__name__', fn)}", PASS)

    def model(targs, tkw, od, expected):
        cd = _compute_dtype(name, (lhs, rhs), expected)
        return ops.ufunc(name, targs, {}, od, cd)

    native = lambda: fn(_real(lhs), _real(rhs))  # noqa: E731
    return _run(tracer, f"operator {fn.__name__}", native, model, (lhs, rhs), {})


def _operand(x) -> bool:
    return isinstance(x, (np.ndarray, np.generic, bool, int, float))


def unary(interp, fn, value):
    name = ops.OPERATORS.get(fn)
    if name is None:
        return _break(interp.tracer, f"operator {fn.__name__}", PASS)

    def model(targs, tkw, od, expected):
        return ops.ufunc(name, targs, {}, od, _torch_dtype(expected.dtype))

    return _run(interp.tracer, f"operator {fn.__name__}", lambda: fn(value), model, (value,), {})


def _inplace(interp, fn, base, lhs, rhs):
    """`lhs op= rhs`: NumPy on a copy (its result, or eager's error: same_kind casting), then a
    recorded `copy_` of the out-of-place result into the backing tensor."""
    tracer = interp.tracer
    t = traced(tracer, lhs)
    if isinstance(lhs, np.ndarray) and t is None:
        return _break(tracer, f"operator {fn.__name__}", PASS, "into an array from outside")
    if t is None or isinstance(lhs, np.generic):
        return binary(interp, base, lhs, rhs)  # a scalar's `+=` makes a new object: as `+`
    name = ops.OPERATORS[base]
    if not _operand(rhs):
        return _break(tracer, f"operator {fn.__name__}", PASS, "with this operand")
    expected = fn(lhs.copy(), _real(rhs))  # eager's result, and eager's errors

    def model(targs, tkw, od, _):
        cd = _torch_dtype(np.result_type(lhs, _dtype_probe(rhs)))
        return ops.ufunc(name, targs, {}, cd, cd).to(t.dtype)

    return _store(interp, f"operator {fn.__name__}", lhs, t, expected, model, (lhs, rhs))


def _store(interp, label, arr, t, expected, model, args):
    tracer = interp.tracer
    try:
        targs = tuple(_to_torch(tracer, a) for a in args)
        r = model(targs, {}, t.dtype, expected)
        why = _matches(tracer, r, expected, ())
    except (ops.Unmodelled, RuntimeError, TypeError, ValueError, IndexError) as e:
        why = str(e)[:100]
    if why is not None:
        return _break(tracer, label, PASS, why)
    t.copy_(r)  # recorded: an in-place op on the backing tensor (and on the array's memory)
    return arr


def subscript(interp, arr, key):
    """`arr[key]` (arr traced, or key holding traced arrays)."""
    tracer = interp.tracer
    if isinstance(arr, torch.Tensor):
        return PASS  # a NumPy index into a tensor: the recorder's break
    if not isinstance(arr, np.ndarray):  # `lst[a.argmax()]`: a Python index out of the data
        if traced(tracer, arr) is None:
            return _break(tracer, "an index", PASS, "it reads the array's data in Python")
        return _break(tracer, "indexing a NumPy scalar", PASS)
    tkey = _index(tracer, key)
    if tkey is _BAD:
        return _break(tracer, "indexing", PASS, "with this kind of index")

    def model(targs, tkw, od, expected):
        return targs[0][tkey]

    native = lambda: arr[_real(key)]  # noqa: E731
    return _run(tracer, "indexing", native, model, (arr, *_key_arrays(key)), {})


def _key_arrays(key) -> tuple:
    items = key if type(key) is tuple else (key,)
    return tuple(k for k in items if isinstance(k, (np.ndarray, np.generic)))


def _index(tracer, key):
    """The torch form of a NumPy index, or _BAD where it is not modelled."""
    if type(key) is tuple:
        parts = [_index(tracer, k) for k in key]
        return _BAD if any(p is _BAD for p in parts) else tuple(parts)
    if key is None or key is Ellipsis or _int(key):
        return key
    if type(key) is slice:
        if not all(v is None or _int(v) for v in (key.start, key.stop, key.step)):
            return _BAD
        return _BAD if key.step is not None and key.step < 0 else key
    if isinstance(key, (np.ndarray, np.generic)):
        t = _to_torch(tracer, key)
        if t.dtype not in (torch.bool, torch.int64, torch.int32):
            return _BAD
        return t.long() if t.dtype == torch.int32 else t
    if type(key) is list and key and all(type(k) is int for k in key):
        return key
    return _BAD


_BAD = object()


def _int(v) -> bool:
    """A Python int, or a symbolic size (an int subclass), not a bool (NumPy's `a[True]`)."""
    return isinstance(v, int) and type(v) is not bool


def store_subscript(interp, arr, key, value):
    """`arr[key] = value` of a traced array: a recorded index store into its tensor."""
    tracer = interp.tracer
    t = traced(tracer, arr)
    if t is None or not isinstance(arr, np.ndarray):
        if isinstance(arr, np.ndarray):  # a traced value stored into an array from outside
            return _break(tracer, "an index store", PASS, "into an array from outside")
        return PASS
    tkey = _index(tracer, key)
    if tkey is _BAD or not (_operand(value) or isinstance(value, (list, tuple))):
        return _break(tracer, "an index store", PASS, "with this kind of index or value")
    expected = arr.copy()
    expected[_real(key)] = _real(value)  # eager's result, and eager's errors

    def model(targs, tkw, od, _):
        out = targs[0].clone()
        v = _to_torch(tracer, value)
        v = v.to(t.dtype) if isinstance(v, torch.Tensor) else v
        out[tkey] = v
        return out

    return _store(interp, "an index store", arr, t, expected, model, (arr,))


def attribute(interp, arr, name: str):
    """`arr.<name>` of a traced array: metadata as the backing tensor gives it (symbolic sizes
    stay symbolic), `.T` as a recorded transpose, methods as bound methods (their calls are
    modelled in `call`)."""
    tracer = interp.tracer
    t = traced(tracer, arr)
    if name == "shape":
        return tuple(t.shape)
    if name == "ndim":
        return arr.ndim
    if name == "size":
        return t.numel()
    if name in ("dtype", "itemsize", "nbytes", "strides", "flags"):
        return getattr(arr, name)
    if name in ("T", "mT") and isinstance(arr, np.ndarray):

        def model(targs, tkw, od, expected):
            a = targs[0]
            return a.permute(tuple(reversed(range(a.dim())))) if name == "T" else a.mT

        return _run(tracer, f"ndarray.{name}", lambda: getattr(arr, name), model, (arr,), {})
    value = getattr(arr, name)
    if callable(value) and getattr(value, "__self__", None) is arr:
        return value  # a method: its call is modelled (or breaks) in `call`
    return _break(tracer, f"ndarray.{name}", value, "an attribute kiln does not model")


def data_read(interp, value, what: str) -> None:
    """Python reads a traced array's data (`bool(a)`, `x in a`, formatting): a graph break."""
    if traced(interp.tracer, value) is not None:
        interp.tracer.graph_break(f"NumPy: {what} reads the array's data in Python", _HINT)


def iterate(interp, arr):
    """`for row in a`: the rows, each a traced `a[i]`."""
    if arr.ndim == 0:
        return PASS  # (NumPy raises: iteration over a 0-d array)
    rows = []
    for i in range(len(arr)):
        row = subscript(interp, arr, i)
        rows.append(arr[i] if row is PASS else row)
    return iter(rows)


__all__ = ["call", "binary", "unary", "subscript", "store_subscript", "attribute", "numpy_of"]
