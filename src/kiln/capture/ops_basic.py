"""Opcode handlers: the stack, locals, cells, globals, attributes, operators and subscripts.

Each handler takes (interpreter, frame, instruction) and does what CPython does, on real
values; reads from outside the frame (globals, closure cells, attributes and items of outside
objects) are reported to the tracer, which guards them.
"""

from __future__ import annotations

import operator
import types

import torch

from . import bytecode as bc
from . import containers, environ, numpy_trace
from .attributes import _class_attr
from .bytecode import NULL, opcode
from .calls import delete_attr, load_attr, store_attr
from .errors import GraphBreakAt, ResumableBreak
from .sources import CellSource, ConstSource, GlobalSource, ItemSource
from .symbolic import apply as sym_apply


@opcode("PRECALL", until=(3, 12))
@opcode("NOP", "RESUME", "EXTENDED_ARG")
def op_nop(interp, frame, inst):
    return None


@opcode("POP_TOP")
def op_pop_top(interp, frame, inst):
    frame.stack.pop()


@opcode("PUSH_NULL")
def op_push_null(interp, frame, inst):
    frame.stack.append(NULL)


@opcode("COPY")
def op_copy(interp, frame, inst):
    frame.stack.append(frame.stack[-inst.arg])


@opcode("SWAP")
def op_swap(interp, frame, inst):
    s = frame.stack
    s[-1], s[-inst.arg] = s[-inst.arg], s[-1]


@opcode("END_FOR", since=(3, 12))
def op_end_for(interp, frame, inst):
    frame.stack.pop()
    if bc.PY < (3, 13):
        frame.stack.pop()


@opcode("LOAD_CONST")
def op_load_const(interp, frame, inst):
    frame.stack.append(inst.argval)


@opcode("RETURN_CONST", since=(3, 12))
def op_return_const(interp, frame, inst):
    from .bytecode import RETURN

    return (RETURN, inst.argval)


# ---- locals ------------------------------------------------------------------------------------
def _unbound_local(name):
    return UnboundLocalError(
        f"cannot access local variable '{name}' where it is not associated with a value"
    )


@opcode("LOAD_FAST_CHECK", since=(3, 12))
@opcode("LOAD_FAST")
def op_load_fast(interp, frame, inst):
    try:
        frame.stack.append(frame.locals[inst.argval])
    except KeyError:
        raise _unbound_local(inst.argval) from None


@opcode("LOAD_FAST_AND_CLEAR", since=(3, 12))
def op_load_fast_and_clear(interp, frame, inst):
    frame.stack.append(frame.locals.pop(inst.argval, NULL))


@opcode("STORE_FAST")
def op_store_fast(interp, frame, inst):
    value = frame.stack.pop()
    if value is NULL:  # restoring a cleared comprehension variable (3.12)
        frame.locals.pop(inst.argval, None)
    else:
        frame.locals[inst.argval] = value


@opcode("DELETE_FAST")
def op_delete_fast(interp, frame, inst):
    if inst.argval not in frame.locals:
        raise _unbound_local(inst.argval)
    del frame.locals[inst.argval]


@opcode("LOAD_FAST_LOAD_FAST", since=(3, 13))
def op_load_fast_load_fast(interp, frame, inst):
    a, b = inst.argval
    frame.stack.append(frame.locals[a])
    frame.stack.append(frame.locals[b])


@opcode("STORE_FAST_LOAD_FAST", since=(3, 13))
def op_store_fast_load_fast(interp, frame, inst):
    a, b = inst.argval
    frame.locals[a] = frame.stack.pop()
    frame.stack.append(frame.locals[b])


@opcode("STORE_FAST_STORE_FAST", since=(3, 13))
def op_store_fast_store_fast(interp, frame, inst):
    a, b = inst.argval
    frame.locals[a] = frame.stack.pop()
    frame.locals[b] = frame.stack.pop()


# ---- cells -------------------------------------------------------------------------------------
@opcode("MAKE_CELL")
def op_make_cell(interp, frame, inst):
    name = inst.argval
    cell = types.CellType(frame.locals[name]) if name in frame.locals else types.CellType()
    interp.tracer.inner_cells.add(id(cell))
    interp.tracer.keepalive.append(cell)
    frame.locals[name] = cell


@opcode("COPY_FREE_VARS")
def op_copy_free_vars(interp, frame, inst):
    closure = frame.fn.__closure__ or ()
    for name, cell in zip(frame.code.co_freevars, closure):
        frame.locals[name] = cell


@opcode("LOAD_CLOSURE")
def op_load_closure(interp, frame, inst):
    frame.stack.append(frame.locals[inst.argval])


@opcode("LOAD_DEREF")
def op_load_deref(interp, frame, inst):
    cell = frame.locals[inst.argval]
    try:
        value = cell.cell_contents
    except ValueError:
        raise _unbound_cell(frame, inst.argval) from None
    tracer = interp.tracer
    if (
        tracer.recording
        and id(cell) not in tracer.inner_cells
        and id(cell) not in (tracer.mutated_objs)
    ):
        tracer.track(value, CellSource(cell, inst.argval))
    frame.stack.append(value)


@opcode("STORE_DEREF")
def op_store_deref(interp, frame, inst):
    cell = frame.locals[inst.argval]
    cell.cell_contents = frame.stack.pop()
    tracer = interp.tracer
    if id(cell) not in tracer.inner_cells:
        tracer.mutated_objs.add(id(cell))
        tracer.side_effects.store_cell(cell, CellSource(cell, inst.argval))
        tracer.effects_visible = True


@opcode("DELETE_DEREF")
def op_delete_deref(interp, frame, inst):
    cell = frame.locals[inst.argval]
    try:
        del cell.cell_contents
    except ValueError:
        raise _unbound_cell(frame, inst.argval) from None


def _unbound_cell(frame, name: str) -> Exception:
    """CPython's error for an empty cell: the frame's own variable (a local that a nested
    function captures) is an unbound local; a variable of an enclosing function is not."""
    if name in frame.code.co_cellvars:
        return _unbound_local(name)
    return NameError(
        f"cannot access free variable '{name}' where it is not associated with a value in "
        "enclosing scope"
    )


# ---- globals -----------------------------------------------------------------------------------
@opcode("LOAD_GLOBAL")
def op_load_global(interp, frame, inst):
    value = load_global(interp, frame, inst.argval)
    if bc.load_global_pushes_null(inst):
        bc.push_callable(frame.stack, value)
    else:
        frame.stack.append(value)


def load_global(interp, frame, name):
    tracer = interp.tracer
    g = frame.globals
    if name in g:
        value = g[name]
        if tracer.broken is None:
            key = (id(g), name)
            # the same global read again (`F` in every Linear.forward): the first read's
            # guards cover it (the entry holds the dictionary too, so its id stays its own)
            seen = tracer.global_reads.get(key)
            if seen is None or seen[1] is not value or seen[0] is not g:
                if key not in tracer.mutated_attrs:
                    tracer.track(value, GlobalSource(g, name, g is interp.root_globals))
                tracer.global_reads[key] = (g, value)
        return value
    if name in frame.builtins:
        if tracer.recording:
            from . import guards as G

            tracer.guards.add(G.not_in_guard(ConstSource(g, f"G({g.get('__name__')})"), name))
        return frame.builtins[name]
    raise NameError(f"name '{name}' is not defined")


@opcode("STORE_GLOBAL")
def op_store_global(interp, frame, inst):
    frame.globals[inst.argval] = frame.stack.pop()
    _note_global_store(interp, frame, inst.argval)


@opcode("DELETE_GLOBAL")
def op_delete_global(interp, frame, inst):
    del frame.globals[inst.argval]
    _note_global_store(interp, frame, inst.argval)


def _note_global_store(interp, frame, name):
    """A global was assigned or deleted: stop guarding it; replay its final state later."""
    tracer = interp.tracer
    tracer.mutated_attrs.add((id(frame.globals), name))
    tracer.side_effects.store_global(frame.globals, ConstSource(frame.globals, "globals"), name)
    tracer.effects_visible = True


# ---- attributes --------------------------------------------------------------------------------
@opcode("LOAD_ATTR")
def op_load_attr(interp, frame, inst):
    obj = frame.stack.pop()
    name = inst.argval
    if bc.load_attr_is_method(inst):
        _push_method(interp, frame, obj, name)
    else:
        frame.stack.append(_load_attr_at(interp, frame, obj, name))


@opcode("LOAD_METHOD", until=(3, 12))
def op_load_method(interp, frame, inst):
    _push_method(interp, frame, frame.stack.pop(), inst.argval)


def _push_method(interp, frame, obj, name):
    """[meth, self] when `name` is a plain function on the type, else the attribute and NULL."""
    attr = _class_attr(type(obj), name)
    if type(attr) is types.FunctionType and name not in getattr(obj, "__dict__", {}):
        bc.push_callable(frame.stack, attr, obj)
    elif bc.NULL_BELOW_CALLABLE:  # pushed first, so a getter's break resumes with it in place
        frame.stack.append(NULL)
        frame.stack.append(_load_attr_at(interp, frame, obj, name))
    else:  # 3.13: the NULL follows the value (bc.push_result on resuming after a getter's break)
        bc.push_callable(frame.stack, _load_attr_at(interp, frame, obj, name))


def _load_attr_at(interp, frame, obj, name):
    """An attribute load whose value goes straight onto `frame`'s stack: a property getter it
    runs has `frame` as its caller, so a break inside the getter resumes like one inside a
    call (continuations.chain_of). A break at the load itself (a data-dependent size read off a
    tensor) ends the graph with the load as the plain-Python step."""
    try:
        return load_attr(interp, obj, name, frame)
    except ResumableBreak as brk:
        from .continuations import chain_of

        step = ("call", getattr, (obj, name), {})
        raise GraphBreakAt(chain_of(interp, frame), step, brk) from None


@opcode("LOAD_SUPER_ATTR", since=(3, 12))
def op_load_super_attr(interp, frame, inst):
    self_obj = frame.stack.pop()
    cls = frame.stack.pop()
    global_super = frame.stack.pop()
    is_method, two_arg = bc.super_attr_flags(inst)
    sup = global_super(cls, self_obj) if global_super is super else global_super(cls, self_obj)
    value = load_attr(interp, sup, inst.argval)
    if is_method:
        bc.push_callable(frame.stack, value)
    else:
        frame.stack.append(value)


@opcode("STORE_ATTR")
def op_store_attr(interp, frame, inst):
    obj = frame.stack.pop()
    value = frame.stack.pop()
    try:
        store_attr(interp, obj, inst.argval, value)
    except ResumableBreak as brk:  # a tensor attribute a graph cannot hold: the store is the step
        from .continuations import chain_of

        step = ("store", obj, inst.argval, value)
        raise GraphBreakAt(chain_of(interp, frame), step, brk) from None


@opcode("DELETE_ATTR")
def op_delete_attr(interp, frame, inst):
    delete_attr(interp, frame.stack.pop(), inst.argval)


# ---- operators ---------------------------------------------------------------------------------
BINARY = {
    "+": operator.add,
    "&": operator.and_,
    "//": operator.floordiv,
    "<<": operator.lshift,
    "@": operator.matmul,
    "*": operator.mul,
    "%": operator.mod,
    "|": operator.or_,
    "**": operator.pow,
    ">>": operator.rshift,
    "-": operator.sub,
    "/": operator.truediv,
    "^": operator.xor,
    "+=": operator.iadd,
    "&=": operator.iand,
    "//=": operator.ifloordiv,
    "<<=": operator.ilshift,
    "@=": operator.imatmul,
    "*=": operator.imul,
    "%=": operator.imod,
    "|=": operator.ior,
    "**=": operator.ipow,
    ">>=": operator.irshift,
    "-=": operator.isub,
    "/=": operator.itruediv,
    "^=": operator.ixor,
}
COMPARE = {
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
}


@opcode("BINARY_OP")
def op_binary_op(interp, frame, inst):
    rhs = frame.stack.pop()
    lhs = frame.stack.pop()
    sym = bc.BINARY_OPS[inst.arg]
    table = interp.tracer.np_traced
    if table and (id(lhs) in table or id(rhs) in table) and interp.tracer.recording:
        out = numpy_trace.binary(interp, BINARY[sym], lhs, rhs)
        if out is not numpy_trace.PASS:
            frame.stack.append(out)
            return
    if sym.endswith("=") and isinstance(lhs, (list, dict, set)):
        _note_container_mutation(interp, lhs)
    frame.stack.append(sym_apply(BINARY[sym], lhs, rhs))


def _note_container_mutation(interp, obj):
    from .calls import note_container_mutation

    note_container_mutation(interp.tracer, obj)


@opcode("COMPARE_OP")
def op_compare_op(interp, frame, inst):
    rhs = frame.stack.pop()
    lhs = frame.stack.pop()
    sym = inst.argval
    if sym.startswith("bool("):  # 3.13 marks a comparison whose result feeds a branch
        frame.stack.append(bool(compare(interp, sym[5:-1], lhs, rhs)))
    else:
        frame.stack.append(compare(interp, sym, lhs, rhs))


# each comparison's method and its reflection (what `b.__gt__(a)` is to `a < b`)
_RICH = {
    "<": ("__lt__", "__gt__"),
    "<=": ("__le__", "__ge__"),
    "==": ("__eq__", "__eq__"),
    "!=": ("__ne__", "__ne__"),
    ">": ("__gt__", "__lt__"),
    ">=": ("__ge__", "__le__"),
}


def compare(interp, sym: str, lhs, rhs):
    """`lhs <sym> rhs`. When a class defines the comparison in Python (a dataclass's `__eq__`,
    `functools.total_ordering`), Python's protocol runs here, on the interpreter, so what the
    method reads (the objects' fields) is guarded; native code would run it unseen."""
    from .calls import interp_call, python_dunder

    table = interp.tracer.np_traced
    if table and (id(lhs) in table or id(rhs) in table) and interp.tracer.recording:
        out = numpy_trace.binary(interp, COMPARE[sym], lhs, rhs)
        if out is not numpy_trace.PASS:
            return out
    if type(lhs) in _NATIVE_COMPARED and type(rhs) in _NATIVE_COMPARED:
        return sym_apply(COMPARE[sym], lhs, rhs)
    name, reflected = _RICH[sym]
    order = [(lhs, name, rhs), (rhs, reflected, lhs)]
    if type(rhs) is not type(lhs) and isinstance(rhs, type(lhs)):
        order.reverse()  # a subclass's reflected method goes first, as in CPython
    fns = [python_dunder(obj, meth) for obj, meth, _ in order]
    if fns[0] is None and fns[1] is None:
        if sym == "!=" and _ne_from_eq(lhs, rhs):
            return not compare(interp, "==", lhs, rhs)  # what object.__ne__ does
        return sym_apply(COMPARE[sym], lhs, rhs)
    for (obj, meth, other), fn in zip(order, fns):
        if fn is not None:
            out = interp_call(interp, fn, (obj, other), {})
        else:
            out = getattr(type(obj), meth)(obj, other)
        if out is not NotImplemented:
            return out
    if sym in ("==", "!="):
        return (lhs is rhs) == (sym == "==")
    return sym_apply(COMPARE[sym], lhs, rhs)  # raises the TypeError eager raises


def _ne_from_eq(lhs, rhs) -> bool:
    """`!=` is object's on both sides, which inverts `__eq__`: a Python `__eq__` then runs."""
    from .calls import python_dunder

    ne = object.__ne__
    return (
        type(lhs).__ne__ is ne
        and type(rhs).__ne__ is ne
        and (python_dunder(lhs, "__eq__") is not None or python_dunder(rhs, "__eq__") is not None)
    )


# types whose comparisons run no Python code of the program's
_NATIVE_COMPARED = frozenset((int, float, bool, str, bytes, type(None), tuple, torch.Tensor))


@opcode("IS_OP")
def op_is_op(interp, frame, inst):
    rhs = frame.stack.pop()
    lhs = frame.stack.pop()
    if interp.tracer.recording:
        containers.pin_identity_test(interp.tracer, lhs, rhs)
    frame.stack.append((lhs is not rhs) if inst.arg else (lhs is rhs))


@opcode("CONTAINS_OP")
def op_contains_op(interp, frame, inst):
    container = frame.stack.pop()
    item = frame.stack.pop()
    from .calls import interp_call, python_dunder

    if type(container) is environ.ENVIRON_TYPE:
        found = environ.contains(interp, item)
        frame.stack.append(not found if inst.arg else found)
        return
    if interp.tracer.np_traced:
        numpy_trace.data_read(interp, container, "`in`")
    fn = python_dunder(container, "__contains__")
    if fn is None and isinstance(container, containers.LOOKED_IN):
        containers.pin_lookup(interp.tracer, container, item)
    found = bool(interp_call(interp, fn, (container, item), {})) if fn else item in container
    frame.stack.append(not found if inst.arg else found)


def _unary(interp, frame, fn):
    value = frame.stack.pop()
    if interp.tracer.np_traced and id(value) in interp.tracer.np_traced:
        if interp.tracer.recording:  # a traced NumPy value (numpy_trace.py)
            out = numpy_trace.unary(interp, fn, value)
            if out is not numpy_trace.PASS:
                frame.stack.append(out)
                return
    frame.stack.append(fn(value))


@opcode("UNARY_NEGATIVE")
def op_unary_negative(interp, frame, inst):
    _unary(interp, frame, operator.neg)


@opcode("UNARY_NOT")
def op_unary_not(interp, frame, inst):
    value = frame.stack.pop()
    if interp.tracer.np_traced:
        numpy_trace.data_read(interp, value, "`not`")
    frame.stack.append(not value)


@opcode("UNARY_INVERT")
def op_unary_invert(interp, frame, inst):
    _unary(interp, frame, operator.invert)


@opcode("UNARY_POSITIVE", until=(3, 12))
def op_unary_positive(interp, frame, inst):
    _unary(interp, frame, operator.pos)


# ---- subscripts --------------------------------------------------------------------------------
@opcode("BINARY_SUBSCR")
def op_binary_subscr(interp, frame, inst):
    key = frame.stack.pop()
    container = frame.stack.pop()
    frame.stack.append(subscript(interp, container, key))


def subscript(interp, container, key):
    from .calls import interp_call, python_dunder
    from .symbolic import plain

    key = plain(key)
    tracer = interp.tracer
    if (
        tracer.np_traced
        and tracer.recording
        and (id(container) in tracer.np_traced or numpy_trace.has_traced(tracer, (key,)))
    ):
        out = numpy_trace.subscript(interp, container, key)
        if out is not numpy_trace.PASS:
            return out
    fn = python_dunder(container, "__getitem__")
    if fn is not None:
        return interp_call(interp, fn, (container, key), {})
    tracer = interp.tracer
    if isinstance(container, (dict, set, frozenset)):  # a lookup by the key's hash
        containers.pin_lookup(tracer, container, key)
    if isinstance(container, dict) and type(container) is not dict and key not in container:
        if hasattr(type(container), "__missing__"):  # a defaultdict inserts the key
            _note_container_mutation(interp, container)
    value = container[key]
    if tracer.recording and isinstance(key, (int, str)) and not isinstance(container, str):
        src = tracer.source_of(container)
        if src is not None and id(container) not in tracer.mutated_objs:
            if isinstance(value, torch.nn.Module) and isinstance(container, torch.nn.Module):
                from .calls import _attr_source

                mods = container.__dict__.get("_modules", {})
                name = next((k for k, v in mods.items() if v is value), None)
                if name is not None:
                    tracer.track(value, _attr_source(tracer, container, src, name, value))
                    return value
            if not hasattr(container, "__dict__") or isinstance(container, dict):
                if tracer.float_slots.slots and type(value) is float:
                    sym = tracer.float_slots.read(container, key)
                    if sym is not None:
                        return sym
                tracer.track(value, ItemSource(src, key))
    return value


@opcode("STORE_SUBSCR")
def op_store_subscr(interp, frame, inst):
    key = frame.stack.pop()
    container = frame.stack.pop()
    value = frame.stack.pop()
    tracer = interp.tracer
    if tracer.np_traced and tracer.recording and type(container).__module__ == "numpy":
        if numpy_trace.has_traced(tracer, (container, key, value)):
            out = numpy_trace.store_subscript(interp, container, key, value)
            if out is not numpy_trace.PASS:
                return
    if type(container) not in (list, dict) and not isinstance(container, torch.Tensor):
        from .calls import interp_call, python_dunder

        # a user class's, or a list/dict subclass's override: it runs on the interpreter, so
        # what it changes (the contents, through the base class's method) is seen
        fn = python_dunder(container, "__setitem__")
        if fn is not None:
            interp_call(interp, fn, (container, key, value), {})
            return
    if isinstance(container, (list, dict)):
        _note_container_mutation(interp, container)
    container[key] = value


@opcode("DELETE_SUBSCR")
def op_delete_subscr(interp, frame, inst):
    key = frame.stack.pop()
    container = frame.stack.pop()
    if type(container) not in (list, dict) and not isinstance(container, torch.Tensor):
        from .calls import interp_call, python_dunder

        fn = python_dunder(container, "__delitem__")
        if fn is not None:
            interp_call(interp, fn, (container, key), {})
            return
    if isinstance(container, (list, dict)):
        _note_container_mutation(interp, container)
    del container[key]


@opcode("BINARY_SLICE", since=(3, 12))
def op_binary_slice(interp, frame, inst):
    end = frame.stack.pop()
    start = frame.stack.pop()
    container = frame.stack.pop()
    # `x[a:b]` is one opcode on 3.12 but the same `__getitem__(slice)` as 3.11's BINARY_SUBSCR:
    # a ModuleList's slice must run on kiln's interpreter so its modules keep their sources.
    frame.stack.append(subscript(interp, container, slice(start, end)))


@opcode("STORE_SLICE", since=(3, 12))
def op_store_slice(interp, frame, inst):
    end = frame.stack.pop()
    start = frame.stack.pop()
    container = frame.stack.pop()
    value = frame.stack.pop()
    if isinstance(container, list):
        _note_container_mutation(interp, container)
    container[start:end] = value


@opcode("BUILD_SLICE")
def op_build_slice(interp, frame, inst):
    if inst.arg == 3:
        step = frame.stack.pop()
        end = frame.stack.pop()
        start = frame.stack.pop()
        frame.stack.append(slice(start, end, step))
    else:
        end = frame.stack.pop()
        start = frame.stack.pop()
        frame.stack.append(slice(start, end))
