"""Calls and attribute access inside a trace: inline, run natively, or break the graph.

Takes a callable and its arguments (or an object and an attribute name) as the interpreter
meets them; gives the result. Python functions are inlined (run on kiln's interpreter) so that
what they read is guarded; torch functions and pure builtins run natively (the recording mode
sees every torch call they make); nn.Module calls run their hooks and `forward` as
`Module.__call__` would; anything kiln does not model is a graph break, after which the call
still runs, natively, so the traced call finishes with eager's result.
"""

from __future__ import annotations

import abc
import functools
import math
import operator
import types
import weakref
from contextvars import ContextVar
from typing import Any

import torch

from . import (
    checkpoint,
    collectives,
    containers,
    context_vars,
    effect_calls,
    environ,
    higher_order,
    numpy_trace,
    optimizers,
    process_order,
)
from .attributes import (  # noqa: F401  (re-exported: handlers import them from here)
    STRUCTURE,
    _attr_source,
    _class_attr,
    delete_attr,
    load_attr,
    python_dunder,
    store_attr,
)
from .effect_calls import LOGGER_TYPES, is_log_name
from .sources import WeakRefSource
from .symbolic import _Sym
from .symbolic import convert as sym_convert
from .symbolic import plain as sym_plain

# Python functions run natively rather than inlined: torch APIs that dispatch through
# __torch_function__ (the recording mode sees them as one call) and pure library helpers.
NATIVE_PY_MODULES = (
    "torch.nn.functional",
    "torch.functional",
    "torch._tensor",
    "torch.overrides",
    "torch._jit_internal",
    "torch.nn.init",
    "torch._refs",
    "torch._prims",
    "torch._decomp",
    "torch.fx",
    "torch.utils._pytree",
    "torch.autograd.grad_mode",
    "torch.amp.autocast_mode",
    "torch.random",
    "dataclasses",
    "typing",
    "inspect",
    "abc",
    "copy",
    "enum",
    "warnings",
    "collections",
    "_collections_abc",
    "re",
    "string",
    "numbers",
    "torch.types",
    "torch._utils",
    "torch.utils.hooks",
)

PURE_BUILTINS = {
    abs,
    all,
    any,
    ascii,
    bin,
    bool,
    callable,
    chr,
    divmod,
    enumerate,
    filter,
    float,
    format,
    frozenset,
    hash,
    hex,
    int,
    isinstance,
    issubclass,
    iter,
    len,
    list,
    map,
    max,
    min,
    next,
    oct,
    ord,
    pow,
    range,
    repr,
    reversed,
    round,
    set,
    slice,
    sorted,
    str,
    sum,
    tuple,
    type,
    zip,
    dict,
    complex,
    object,
    bytes,
    id,
}
PURE_MODULES = (
    "math",
    "operator",
    "_operator",
    "itertools",
    "functools",
    "_functools",
    "builtins",
    "cmath",
    "_abc",
    "posix",
    "_collections",
    "string",
)
MUTATING = {
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "sort",
    "reverse",
    "update",
    "setdefault",
    "popitem",
    "add",
    "discard",
    "difference_update",
    "intersection_update",
    "symmetric_difference_update",
    "__setitem__",
    "__delitem__",
    "__iadd__",
    "__ior__",
    "move_to_end",
}
CONTAINERS = (list, dict, set, collections_deque := __import__("collections").deque)
# torch C functions that change global state kiln does not record in graphs
GRAD_STATE = {
    "_set_grad_enabled",
    "set_autocast_enabled",
    "set_autocast_dtype",
    "autocast_increment_nesting",
    "autocast_decrement_nesting",
    "clear_autocast_cache",
    "set_autocast_cache_enabled",
    "set_autocast_cpu_enabled",
    "set_autocast_gpu_dtype",
    "set_autocast_cpu_dtype",
    "set_autocast_ipu_enabled",
    "set_autocast_xla_enabled",
}
BUILTIN_TYPES = (
    types.BuiltinFunctionType,
    types.BuiltinMethodType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.ClassMethodDescriptorType,
)

# Tensor methods some torch versions run without __torch_function__: checked here as well.
DATA_METHODS = {"item", "tolist", "numpy", "data_ptr", "__bool__", "__int__", "__float__"}
# Calls into these modules are graph breaks (their effects are outside the program's values),
# except log calls, which are replayed (effect_calls.py).
BREAK_MODULES = ("logging",)

# Functions marked with kiln.disable / kiln.allow_in_graph, by id. Each table holds the function
# itself, and a lookup checks identity: an id alone outlives its object, and a new function
# allocated at the freed address would inherit the mark.
_disabled: dict[int, Any] = {}
# builtins of torch modules found to run natively (F.linear, torch.cat): decided once each
_TORCH_NATIVE: set = set()
_TORCH_IS_COMPILING = torch.compiler.is_compiling
_TORCH_ASSERT = torch._assert
# the code of torch's own `_disable_dynamo` wrapper (Optimizer.zero_grad, state_dict, ...)
_TORCH_DISABLE_CODE = torch._disable_dynamo(lambda: None).__code__
_allow_in_graph: dict[int, Any] = {}
# autograd.Function.apply: a Python classmethod up to torch 2.13, a C one from 2.14 (bound, a
# builtin method whose __self__ is the Function class)
_FUNCTION_APPLY = getattr(torch.autograd.Function.apply, "__func__", None)


def _is_c_function_apply(fn) -> bool:
    owner = getattr(fn, "__self__", None)
    return (
        type(fn) is types.BuiltinMethodType
        and isinstance(owner, type)
        and issubclass(owner, torch.autograd.Function)
        and fn.__name__ == "apply"
    )


# ---- calls --------------------------------------------------------------------------------------
def interp_call(interp, fn: Any, args: tuple, kwargs: dict, site=None) -> Any:
    """Call `fn` inside the trace. `site` is the frame whose CALL receives the result directly
    (no Python code in between); only frames entered that way can be resumed after a break."""
    tracer = interp.tracer
    if tracer.np_traced or args and type(args[0]) is torch.Tensor and _numpy_fn(fn):
        if tracer.broken is None:  # NumPy on traced arrays (numpy_trace.py)
            out = numpy_trace.call(interp, fn, args, kwargs, _inlinable)
            if out is not numpy_trace.PASS:
                return out
    t = type(fn)
    if t is types.FunctionType:
        if args and type(args[0]) is environ.ENVIRON_TYPE:
            return environ.call(interp, fn, args, kwargs)
        if fn is _MODULE_CALL and args and isinstance(args[0], torch.nn.Module):
            return call_module(interp, args[0], args[1:], kwargs, site)  # Module.__call__(m, x)
        key = (fn.__module__, fn.__qualname__)
        if key in _rng_state_fns():
            return _break_and_run(
                interp,
                fn,
                args,
                kwargs,
                f"{_describe(fn)} reads or sets a random generator's state, which a graph "
                "does not replay",
                "it runs between graphs, on every call, as in eager",
            )
        if (fn.__module__, fn.__name__) in collectives.eager_collectives():
            return _break_and_run(
                interp, fn, args, kwargs, collectives.reason(fn), collectives.HINT
            )
        if fn is _TORCH_IS_COMPILING:
            # kiln is compiling this code: libraries (transformers) take their compile-friendly
            # branches on this, as under torch.compile, instead of data-dependent Python
            return True
        if fn is checkpoint.CHECKPOINT and args and checkpoint.modelled(kwargs):
            return checkpoint.run_checkpointed(
                interp, args, kwargs, lambda f, a, k: interp_call(interp, f, a, k)
            )
        if fn in higher_order.ENTRY_POINTS:  # torch.cond, while_loop: subgraphs
            return higher_order.call(
                interp, fn, args, kwargs, native_call, lambda f, a: interp_call(interp, f, a, {})
            )
        if fn is _TORCH_ASSERT and args and not isinstance(args[0], torch.Tensor):
            # A Python condition (a shape check): checked here. Inlined, `torch._assert` would
            # ask the recording mode to handle a bool and break the graph.
            if not bool(args[0]):
                raise AssertionError(args[1] if len(args) > 1 else kwargs.get("message"))
            return None
        if _disabled.get(id(fn)) is fn:
            return _break_and_run(
                interp,
                fn,
                args,
                kwargs,
                f"{fn.__qualname__} is kiln.disable'd",
                "the call runs eagerly; the rest of the function is compiled separately",
            )
        if args and isinstance(args[0], LOGGER_TYPES) and is_log_name(fn.__name__):
            return effect_calls.replayed(interp, fn, args, kwargs)  # logger.warning_advice
        if getattr(fn, "_torchdynamo_disable", False):
            orig = getattr(fn, "_torchdynamo_orig_callable", None)
            if (getattr(orig, "__module__", None) or "").startswith("torch.optim."):
                # TorchDynamo, once used, wraps the optimizers' `_init_group`s so that it does
                # not trace them itself (it models them on its own); kiln traces them as code
                return interp_call(interp, orig, args, kwargs, site)
        if fn.__code__ is _TORCH_DISABLE_CODE or getattr(fn, "_torchdynamo_disable", False):
            return _break_and_run(
                interp,
                fn,
                args,
                kwargs,
                f"{fn.__qualname__} is torch.compiler.disable'd",
                "the call runs eagerly (as under torch.compile); the rest of the function is "
                "compiled separately",
            )
        route = _module_route(fn.__module__ or "")
        if route == "break":
            if effect_calls.is_logging_function(fn):
                return effect_calls.replayed(interp, fn, args, kwargs)
            if effect_calls.is_logging_query(fn):
                return effect_calls.answered(interp, fn, args, kwargs)
            return _break_and_run(
                interp,
                fn,
                args,
                kwargs,
                f"call to {_describe(fn)} (logging)",
                "logging runs eagerly between graphs; to avoid the break, log "
                "outside the compiled function",
            )
        compiled = getattr(fn, "_kiln_compiled", None)
        if compiled is not None:
            return interp_call(interp, compiled.root_callable, args, kwargs, site)
        if route == "native" and args and _mixin_on_user_object(fn, args[0]):
            route = "inline"
        if route == "native" or _allow_in_graph.get(id(fn)) is fn:
            return native_call(interp, fn, args, kwargs)
        return interp.call_function(fn, args, kwargs, site)
    if t is types.MethodType:
        if fn.__func__ is _FUNCTION_APPLY and isinstance(fn.__self__, type):
            return interp.tracer.record_function_apply(fn.__self__, args, kwargs)
        if fn.__func__ is _MODULE_CALL and isinstance(fn.__self__, torch.nn.Module):
            # `super().__call__(...)` in a module class that overrides `__call__`
            return call_module(interp, fn.__self__, args, kwargs, site)
        if isinstance(fn.__self__, torch.optim.Optimizer):  # its step counts on the device
            optimizers.keep_state_on_device(fn.__self__)
        return interp_call(interp, fn.__func__, (fn.__self__, *args), kwargs, site)
    if isinstance(fn, torch.nn.Module):
        own = _class_attr(t, "__call__")
        if own is not _MODULE_CALL and type(own) is types.FunctionType and _inlinable(own):
            # A module class's own `__call__` (Hugging Face's GradientCheckpointingLayer wraps
            # its call in `checkpoint`) runs as Python does: skipping it for Module.__call__'s
            # semantics silently dropped what it does (the checkpointing)
            return interp_call(interp, own, (fn, *args), kwargs, site)
        return call_module(interp, fn, args, kwargs, site)
    if t is functools.partial:
        return interp_call(interp, fn.func, (*fn.args, *args), {**fn.keywords, **kwargs}, site)
    if isinstance(fn, type):
        return call_class(interp, fn, args, kwargs)
    if isinstance(fn, BUILTIN_TYPES):
        if _FUNCTION_APPLY is None and _is_c_function_apply(fn):
            return interp.tracer.record_function_apply(fn.__self__, args, kwargs)
        return call_builtin(interp, fn, args, kwargs)
    if t is effect_calls.LRU_WRAPPER:
        return effect_calls.cached_call(
            interp, fn, args, kwargs, lambda f, a, k: interp_call(interp, f, a, k, site)
        )
    if t is weakref.ReferenceType and not args and not kwargs:
        return _dereference(interp.tracer, fn)
    call = _class_attr(t, "__call__")
    if type(call) is types.FunctionType and (_inlinable(call) or call is _GENERIC_ALIAS_CALL):
        return interp_call(interp, call, (fn, *args), kwargs, site)
    return call_builtin(interp, fn, args, kwargs)


# `Box[int](v)`: typing's alias calls the class and notes `__orig_class__` on the instance; run
# on the interpreter, the class's __init__ is seen (typing's other functions run natively)
_MODULE_CALL = torch.nn.Module.__call__
_GENERIC_ALIAS_CALL = __import__("typing")._BaseGenericAlias.__dict__.get("__call__")


@functools.lru_cache(maxsize=1)
def _rng_state_fns() -> frozenset[tuple[str, str]]:
    """torch's Python functions that read or set a generator's state (torch.manual_seed runs
    natively and would otherwise happen on the traced call only; a state read would be the
    traced call's state on every later call), by module and name: importing torch._dynamo
    rebinds `torch.manual_seed` to a wrapper that keeps both. Generator methods and Python's
    and NumPy's generators are C calls: graph breaks already."""
    names = ("manual_seed", "seed", "get_rng_state", "set_rng_state", "initial_seed")
    fns = [getattr(torch, n, None) for n in names]
    fns += [getattr(torch.random, n, None) for n in names]
    cuda_names = (*names, "manual_seed_all", "seed_all", "get_rng_state_all", "set_rng_state_all")
    fns += [getattr(torch.cuda, n, None) for n in cuda_names]
    return frozenset((f.__module__, f.__qualname__) for f in fns if callable(f))


_MIXIN_MODULES = ("collections", "_collections_abc")


def _mixin_on_user_object(fn: types.FunctionType, obj: Any) -> bool:
    """A method of collections' Python classes (UserList, UserDict, the MutableMapping mixins)
    called on an instance of a Python class: it runs that class's own methods and changes the
    object, which kiln must see (natively, the change would happen on the traced call only)."""
    return fn.__module__ in _MIXIN_MODULES and bool(type(obj).__flags__ & _HEAP_TYPE)


_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a `class` statement


def _dereference(tracer, ref: weakref.ref) -> Any:
    """`ref()` of a weak reference read from outside (an LR scheduler's reference to its
    optimizer): the object, read from `<ref's source>()` with its own guards and sources."""
    value = ref()
    src = tracer.source_of(ref)
    if src is not None and tracer.recording:
        tracer.track(value, WeakRefSource(src))
    return value


def _inlinable(fn: types.FunctionType) -> bool:
    return _module_route(fn.__module__ or "") != "native"


@functools.lru_cache(maxsize=4096)
def _module_route(mod: str) -> str:
    """How calls of Python functions defined in module `mod` run: "native" (kiln's own code,
    torch APIs that dispatch to the recording mode, pure library helpers), "break" (logging)
    or "inline" (on kiln's interpreter)."""
    if mod.startswith("kiln.") and not mod.startswith("kiln.tests") or _is_native_module(mod):
        return "native"
    if mod.split(".", 1)[0] in BREAK_MODULES:
        return "break"
    return "inline"


@functools.lru_cache(maxsize=4096)
def _is_native_module(mod: str) -> bool:
    return any(mod == m or mod.startswith(m + ".") for m in NATIVE_PY_MODULES)


@functools.lru_cache(maxsize=4096)
def _is_library(mod: str) -> bool:
    top = mod.split(".", 1)[0]
    return top in (
        "torch",
        "math",
        "operator",
        "functools",
        "itertools",
        "collections",
        "typing",
        "dataclasses",
        "numpy",
        "builtins",
        "enum",
        "copy",
        "inspect",
        "warnings",
        "sys",
        "os",
        "re",
        "abc",
        "einops",
        "transformers",
    )


def native_call(interp, fn, args, kwargs):
    process_order.note_call(interp.tracer, fn, args, kwargs)
    slots = interp.tracer.float_slots
    if slots.slots:  # dicts holding dynamic floats: what kiln cannot follow sees exact values
        slots.escape(getattr(fn, "__self__", None), args, tuple(kwargs.values()))
    interp.native_nesting += 1
    try:
        result = fn(*args, **kwargs)
    finally:
        interp.native_nesting -= 1
    interp.tracer.sync_state()
    return result


def _break_and_run(interp, fn, args, kwargs, reason: str, hint: str = ""):
    interp.tracer.graph_break(reason, hint)
    return native_call(interp, fn, args, kwargs)


def call_builtin(interp, fn, args: tuple, kwargs: dict) -> Any:
    tracer = interp.tracer
    if fn is isinstance and len(args) == 2 and isinstance(args[0], _Sym):
        return isinstance(args[0]._plain(), args[1])  # its type is guarded, not its value
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.Tensor):  # `x.view(...)`, the common case, decided as below
        return _tensor_method(interp, fn, args, kwargs)
    try:
        if fn in _TORCH_NATIVE:
            return native_call(interp, fn, args, kwargs)
    except TypeError:  # a method of an unhashable object
        pass
    special = _SPECIAL.get(fn) if _hashable(fn) else None
    if special is not None:
        return special(interp, args, kwargs)
    if fn in _CONVERTING and len(args) == 1 and not kwargs and isinstance(args[0], _Sym):
        converted = sym_convert(fn, args[0])  # math.ceil(n / 8), round(n / 2), index(n)
        if converted is not None:
            return converted
    if type(owner) is ContextVar or getattr(fn, "__objclass__", None) is ContextVar:
        return context_vars.call(interp, fn, args, kwargs)
    name = getattr(fn, "__name__", type(fn).__name__)
    if name == "get" and type(owner) is dict and tracer.float_slots.slots and args:
        containers.pin_lookup(tracer, owner, args[0])
        sym = tracer.float_slots.read(owner, args[0])  # `group.get("lr")`: as group["lr"]
        if sym is not None:
            return sym
    if isinstance(owner, CONTAINERS) and not isinstance(owner, type):
        if name in containers.LOOKUPS and args:
            containers.pin_lookup(tracer, owner, args[0])
        if name in MUTATING and tracer.recording:
            note_container_mutation(tracer, owner)
        return native_call(interp, fn, _trampolines(interp, args), kwargs)
    if type(owner) is torch.Size and name == "numel" and any(isinstance(v, _Sym) for v in owner):
        return functools.reduce(operator.mul, owner, 1)  # symbolic (natively: a plain int)
    if isinstance(owner, (str, bytes, tuple, int, float, frozenset, range, slice, torch.Size)):
        if name in containers.LOOKUPS and args and isinstance(owner, (tuple, frozenset)):
            containers.pin_lookup(tracer, owner, args[0])
        return fn(*args, **kwargs)
    mod = getattr(fn, "__module__", None) or getattr(type(owner), "__module__", "") or ""
    if _hashable(fn) and fn in PURE_BUILTINS or mod in PURE_MODULES:
        if _hashable(fn) and fn in _ITERATING:
            args = _materialize(interp, fn, args)
        return native_call(interp, fn, _trampolines(interp, args), kwargs)
    if (
        mod.startswith("torch")
        or isinstance(owner, types.ModuleType)
        and owner.__name__.startswith("torch")
    ):
        if _numpy_in(args) or kwargs and _numpy_in(tuple(kwargs.values())):
            return _break_and_run(
                interp,
                fn,
                args,
                kwargs,
                f"torch.{name} reads a NumPy array's data, which a graph would keep as the "
                "traced call's constant",
                "make the tensor outside the compiled function, or keep the data in tensors",
            )
        if _stateful_torch(name):
            return _break_and_run(
                interp, fn, args, kwargs, f"torch.{name} changes global state a graph cannot replay"
            )
        if isinstance(owner, types.ModuleType):
            _TORCH_NATIVE.add(fn)  # (a module's function: the same object, the same answer)
        return native_call(interp, fn, args, kwargs)
    if isinstance(owner, type) and (owner.__module__ or "").startswith("torch"):
        return native_call(interp, fn, args, kwargs)
    return _break_and_run(
        interp,
        fn,
        args,
        kwargs,
        f"call to {_describe(fn)}, which kiln does not model",
        "wrap it with kiln.allow_in_graph if it is a pure tensor function, or call it outside "
        "the compiled function",
    )


def _tensor_method(interp, fn, args: tuple, kwargs: dict) -> Any:
    name = getattr(fn, "__name__", "")
    if name == "numpy" and interp.tracer.recording:  # an array backed by the traced tensor
        return numpy_trace.from_tensor(interp, fn.__self__, args, kwargs)
    if name in DATA_METHODS:
        interp.tracer.graph_break(
            f"Tensor.{name}() reads a Python value out of a tensor's data",
            "keep the value as a tensor, or move this code out of the compiled function",
        )
    return native_call(interp, fn, args, kwargs)


def note_container_mutation(tracer, obj) -> None:
    """A list/dict/set is changed in place: stop guarding reads of it, and replay the change
    if it came from outside the frame."""
    tracer.mutated_objs.add(id(obj))
    src = tracer.source_of(obj)
    if src is not None:
        tracer.side_effects.mutate_container(obj, src)
        tracer.effects_visible = True


def _numpy_fn(fn) -> bool:
    mod = getattr(fn, "__module__", None)
    return type(mod) is str and mod.startswith("numpy") or type(fn).__name__ == "ufunc"


def _numpy_in(args: tuple) -> bool:
    return any(type(a).__module__ == "numpy" and hasattr(a, "__array__") for a in args)


def _stateful_torch(name: str) -> bool:
    if name in GRAD_STATE:
        return False
    return name.startswith(("set_", "_set_", "manual_seed", "seed")) or name in (
        "use_deterministic_algorithms",
        "set_default_dtype",
        "set_rng_state",
    )


def _describe(fn) -> str:
    mod = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{mod}.{name}" if mod else name


def _hashable(x) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


_ITERATING = {
    enumerate,
    zip,
    list,
    tuple,
    set,
    frozenset,
    sorted,
    sum,
    map,
    filter,
    min,
    max,
    any,
    all,
    reversed,
    dict,
}


def _materialize(interp, fn, args: tuple) -> tuple:
    """Iterate user-level iterables (ModuleList, a user container) on kiln's interpreter before
    a native builtin consumes them, so the items they hand out keep their sources."""
    if fn is zip:
        positions = range(len(args))
    elif fn in (map, filter):
        positions = range(1, len(args))
    elif fn in (min, max) and len(args) != 1:
        positions = range(0)
    else:
        positions = range(min(1, len(args)))
    out = list(args)
    for i in positions:
        it = python_dunder(out[i], "__iter__")
        if it is not None and not isinstance(out[i], dict):
            out[i] = list(iter(interp_call(interp, it, (out[i],), {})))
    return tuple(out)


def _trampolines(interp, args: tuple) -> tuple:
    """Python functions handed to native builtins (sorted's key, map's function) still run on
    kiln's interpreter, so what they read is guarded; symbolic numbers are specialized, since
    native code reads their value unseen."""
    if any(isinstance(a, _Sym) for a in args):
        args = tuple(sym_plain(a) for a in args)
    if not any(type(a) is types.FunctionType or type(a) is types.MethodType for a in args):
        return args
    out = []
    for a in args:
        if type(a) in (types.FunctionType, types.MethodType):
            f = a
            out.append(lambda *x, _f=f, **k: interp_call(interp, _f, x, k))
        else:
            out.append(a)
    return tuple(out)


def call_class(interp, cls: type, args: tuple, kwargs: dict) -> Any:
    if (cls is int or cls is float) and len(args) == 1 and not kwargs:
        if isinstance(args[0], _Sym):  # `int(x.shape[1])`: stays symbolic (symbolic.convert)
            converted = sym_convert(cls, args[0])
            if converted is not None:
                return converted
    if interp.tracer.float_slots.slots:  # `dict(group)`, `copy(group)`: exact values
        interp.tracer.float_slots.escape(args, tuple(kwargs.values()))
    if cls is super and not args:
        return _zero_arg_super(interp)
    init = cls.__dict__.get("__init__") or _class_attr(cls, "__init__")
    new = _class_attr(cls, "__new__")
    user_class = (
        type(init) is types.FunctionType
        and _inlinable(init)
        and new is object.__new__
        and type(cls) in (type, abc.ABCMeta)  # (object.__new__ refuses abstract ones, as eager)
        and not issubclass(cls, (torch.nn.Module, BaseException, torch.Tensor))
    )
    if user_class:
        obj = object.__new__(cls)
        interp.tracer.created_objects.add(id(obj))
        interp.tracer.keepalive.append(obj)
        interp_call(interp, init, (obj, *args), kwargs)
        return obj
    if cls in _ITERATING:  # enumerate(self.layers), list(self.blocks), zip(...): builtin types
        args = _materialize(interp, cls, args)
    if issubclass(cls, torch.nn.Module):
        from .. import logs

        logs.log(
            "perf_hints",
            f"an nn.Module ({cls.__qualname__}) is constructed inside a compiled function: "
            "parameters it creates keep their first call's values; parameters it is given "
            "(a slice of a ModuleList) stay inputs held by reference",
        )
    obj = native_call(interp, cls, _trampolines(interp, args), kwargs)
    if type(obj) is cls and hasattr(obj, "__dict__") and not isinstance(obj, _HELD_KINDS):
        # made here: rebuilt from its state by the residual program, never handed out by
        # identity (the object of the traced call is not the one a later call makes)
        interp.tracer.created_objects.add(id(obj))
        interp.tracer.keepalive.append(obj)
    return obj


_HELD_KINDS = (torch.nn.Module, torch.Tensor, type, types.ModuleType, BaseException)


def _zero_arg_super(interp):
    frame = interp.frames[-1]
    cell = frame.locals.get("__class__")
    code = frame.code
    if cell is None or code.co_argcount == 0:
        raise RuntimeError("super(): no arguments")
    first = frame.locals.get(code.co_varnames[0])
    if isinstance(first, types.CellType):
        first = first.cell_contents
    return super(cell.cell_contents, first)


from .builtin_specials import SPECIAL as _SPECIAL  # noqa: E402

_CONVERTING = (math.ceil, math.floor, round, operator.index)
from .module_calls import call_module  # noqa: E402


def mark_disabled(fn):
    func = getattr(fn, "__func__", fn)
    _disabled[id(func)] = func
    return fn


def mark_allow_in_graph(fn):
    _allow_in_graph[id(fn)] = fn
    return fn
