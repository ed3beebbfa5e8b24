"""Opcode handlers: calls, keyword names, function creation and CPython's intrinsics.

The stack layout of a call is `[callable_or_NULL, self_or_callable, *args]` on 3.11/3.12 and
`[callable, self_or_NULL, *args]` on 3.13; keyword names arrive in KW_NAMES (3.11/3.12) or on
the stack (CALL_KW, 3.13). Every call goes to calls.interp_call, which decides how to run it.
"""

from __future__ import annotations

import types

from torch.overrides import handle_torch_function

from . import bytecode as bc
from .bytecode import opcode
from .calls import interp_call
from .errors import GraphBreakAt, ResumableBreak


def _call(interp, frame, fn, args: tuple, kwargs: dict):
    """A call whose result goes straight onto this frame's stack; a break inside it becomes
    the end of the graph, with the call itself as the plain-Python step."""
    try:
        return interp_call(interp, fn, args, kwargs, frame)
    except ResumableBreak as brk:
        from .continuations import chain_of

        if brk.step is not None:  # a call kiln runs its own way (data_parallel.py)
            fn, args, kwargs = brk.step
        elif fn is handle_torch_function:
            # Asked of kiln's recording mode; outside the trace no mode answers, so the plain
            # step calls the API itself: handle_torch_function(api, relevant, *args, **kwargs).
            fn, args = args[0], args[2:]
        raise GraphBreakAt(chain_of(interp, frame), ("call", fn, args, kwargs), brk) from None


@opcode("KW_NAMES", until=(3, 13))
def op_kw_names(interp, frame, inst):
    frame.kw_names = frame.code.co_consts[inst.arg]


def _split_kwargs(args: list, names: tuple):
    if not names:
        return args, {}
    n = len(names)
    return args[:-n], dict(zip(names, args[-n:]))


def _pop_args(stack: list, argc: int) -> list:
    args = stack[len(stack) - argc :] if argc else []
    del stack[len(stack) - argc :]
    return args


@opcode("CALL")
def op_call(interp, frame, inst):
    stack = frame.stack
    args = _pop_args(stack, inst.arg)
    fn, lead = bc.pop_callable(stack)
    names = frame.kw_names  # always () on 3.13, where CALL_KW carries keyword names
    frame.kw_names = ()
    pos, kwargs = _split_kwargs([*lead, *args], names)
    stack.append(_call(interp, frame, fn, tuple(pos), kwargs))


@opcode("CALL_KW", since=(3, 13))
def op_call_kw(interp, frame, inst):
    stack = frame.stack
    names = stack.pop()
    args = _pop_args(stack, inst.arg)
    fn, lead = bc.pop_callable(stack)
    pos, kwargs = _split_kwargs([*lead, *args], names)
    stack.append(_call(interp, frame, fn, tuple(pos), kwargs))


@opcode("CALL_FUNCTION_EX")
def op_call_function_ex(interp, frame, inst):
    stack = frame.stack
    kwargs = stack.pop() if inst.arg & 1 else {}
    args = stack.pop()
    fn, lead = bc.pop_call_ex_callable(stack)
    args = (*lead, *args) if lead or not isinstance(args, tuple) else args
    if not isinstance(kwargs, dict):
        kwargs = dict(kwargs)
    stack.append(_call(interp, frame, fn, args, kwargs))


@opcode("MAKE_FUNCTION")
def op_make_function(interp, frame, inst):
    stack = frame.stack
    code = stack.pop()
    flags = bc.make_function_flags(inst)  # 0 on 3.13: SET_FUNCTION_ATTRIBUTE follows
    closure = stack.pop() if flags & 0x08 else None
    annotations = stack.pop() if flags & 0x04 else None
    kwdefaults = stack.pop() if flags & 0x02 else None
    defaults = stack.pop() if flags & 0x01 else None
    if closure is None and code.co_freevars:  # 3.13: the real cells come next
        closure = tuple(types.CellType() for _ in code.co_freevars)
    fn = _new_function(interp, code, frame.globals, defaults, closure)
    if kwdefaults:
        fn.__kwdefaults__ = kwdefaults
    if annotations:
        fn.__annotations__ = _annotations(annotations)
    stack.append(fn)


def _new_function(interp, code, globals_, defaults, closure):
    fn = types.FunctionType(code, globals_, code.co_name, defaults, closure)
    fn.__qualname__ = code.co_qualname
    interp.tracer.keepalive.append(fn)
    interp.tracer.inner_functions.add(id(fn))
    return fn


def _annotations(value) -> dict:
    """A flat (name, value, ...) tuple from the compiler, or already a dict."""
    return dict(zip(value[::2], value[1::2])) if isinstance(value, tuple) else value


@opcode("SET_FUNCTION_ATTRIBUTE", since=(3, 13))
def op_set_function_attribute(interp, frame, inst):
    fn = frame.stack.pop()
    value = frame.stack.pop()
    if inst.arg == 0x08:  # a closure can't be assigned: make the function again, with it
        old = fn
        fn = _new_function(interp, old.__code__, old.__globals__, old.__defaults__, value)
        fn.__kwdefaults__ = old.__kwdefaults__
        fn.__annotations__ = old.__annotations__
    elif inst.arg == 0x01:
        fn.__defaults__ = value
    elif inst.arg == 0x02:
        fn.__kwdefaults__ = value
    elif inst.arg == 0x04:
        fn.__annotations__ = _annotations(value)
    frame.stack.append(fn)


@opcode("CALL_INTRINSIC_1", since=(3, 12))
def op_call_intrinsic_1(interp, frame, inst):
    name = inst.argrepr  # dis names the intrinsic (e.g. INTRINSIC_UNARY_POSITIVE)
    value = frame.stack.pop()
    if name == "INTRINSIC_UNARY_POSITIVE":
        frame.stack.append(+value)
    elif name == "INTRINSIC_LIST_TO_TUPLE":
        frame.stack.append(tuple(value))
    elif name == "INTRINSIC_STOPITERATION_ERROR":
        if isinstance(value, StopIteration):
            raise RuntimeError("generator raised StopIteration") from value
        raise value
    elif name == "INTRINSIC_PRINT":
        frame.stack.append(None)
    elif name in _TYPE_PARAMS:  # `class C[T]`, `def f[**P]` (PEP 695)
        frame.stack.append(_type_param(name, value))
    elif name == "INTRINSIC_SUBSCRIPT_GENERIC":  # the base `Generic[T, *Ts]` of `class C[T, *Ts]`
        import typing

        params = tuple(typing.Unpack[p] if type(p) is typing.TypeVarTuple else p for p in value)
        frame.stack.append(typing._GenericAlias(typing.Generic, params))  # as CPython makes it
    else:
        _intrinsic_not_run(interp, frame, name)


@opcode("CALL_INTRINSIC_2", since=(3, 12))
def op_call_intrinsic_2(interp, frame, inst):
    name = inst.argrepr
    value1 = frame.stack.pop()
    value2 = frame.stack.pop()
    if name == "INTRINSIC_PREP_RERAISE_STAR":
        from .ops_except_star import prep_reraise_star

        frame.stack.append(prep_reraise_star(interp, value2, value1))
    elif name == "INTRINSIC_SET_FUNCTION_TYPE_PARAMS":
        value2.__type_params__ = value1
        frame.stack.append(value2)
    else:
        # a bound, constraints or default of a type parameter: CPython evaluates them lazily
        # (on first use of `T.__bound__`), which no public constructor can do
        _intrinsic_not_run(interp, frame, name)


# the type parameters of PEP 695, made as CPython's intrinsics make them (variance inferred,
# `__module__` "typing"): (constructor name, keyword arguments)
_TYPE_PARAMS = {
    "INTRINSIC_TYPEVAR": ("TypeVar", {"infer_variance": True}),
    "INTRINSIC_PARAMSPEC": ("ParamSpec", {"infer_variance": True}),
    "INTRINSIC_TYPEVARTUPLE": ("TypeVarTuple", {}),
}


def _type_param(intrinsic: str, name: str):
    import typing

    cls, kwargs = _TYPE_PARAMS[intrinsic]
    param = getattr(typing, cls)(name, **kwargs)
    param.__module__ = "typing"
    return param


def _intrinsic_not_run(interp, frame, name: str):
    from .bytecode import PY
    from .errors import AbortTrace

    filename, line = frame.info.location(frame.pc - 1)
    raise AbortTrace(
        f"kiln's interpreter does not implement intrinsic {name} on Python {PY[0]}.{PY[1]}, "
        f"at {filename}:{line}",
        where=interp.location(),
        hint="move this code into a helper function decorated with @kiln.disable",
    )


@opcode("LOAD_ASSERTION_ERROR")
def op_load_assertion_error(interp, frame, inst):
    frame.stack.append(AssertionError)


@opcode("IMPORT_NAME")
def op_import_name(interp, frame, inst):
    fromlist = frame.stack.pop()
    level = frame.stack.pop()
    frame.stack.append(__import__(inst.argval, frame.globals, None, fromlist, level))


@opcode("IMPORT_FROM")
def op_import_from(interp, frame, inst):
    module = frame.stack[-1]
    try:
        frame.stack.append(getattr(module, inst.argval))
    except AttributeError:
        import sys

        full = f"{module.__name__}.{inst.argval}"
        if full in sys.modules:
            frame.stack.append(sys.modules[full])
        else:
            raise ImportError(
                f"cannot import name '{inst.argval}' from '{module.__name__}'"
            ) from None
