"""Opcode handlers: jumps, loops, return and yield, exceptions and `with`.

Branches are taken on real values, so `if` on a Python value simply goes the way it went in
eager (the value was guarded where it was read); `if` on a tensor reaches `Tensor.__bool__`,
which the recorder treats as a graph break. Exceptions use the code's exception table
(bytecode.py); kiln's own signals pass through user `try` blocks untouched.
"""

from __future__ import annotations

from . import bytecode as bc
from . import process_order
from .bytecode import NULL, RETURN, YIELD, opcode


def _jump(frame, inst):
    frame.pc = frame.info.target(inst)


def _truth(interp, frame, inst, value, fall_through: int | None = None) -> bool:
    """`bool(value)` for a branch; on a tensor this is where a graph break lands."""
    from .continuations import GraphBreakAt, ResumableBreak, branch_targets, chain_of

    try:
        if interp.tracer.np_traced:  # `if a.any():` of a traced NumPy value: a break
            from .numpy_trace import data_read

            data_read(interp, value, "a branch on its truth")
        return bool(value)
    except ResumableBreak as brk:
        target, nxt, jump_if_true = branch_targets(frame, inst)
        if fall_through is not None:
            nxt = fall_through
        step = ("branch", value, target, nxt, jump_if_true)
        raise GraphBreakAt(chain_of(interp, frame), step, brk) from None


@opcode("TO_BOOL", since=(3, 13))
def op_to_bool(interp, frame, inst):
    """3.13 converts a branch's condition first: a break here is the following branch's break."""
    value = frame.stack.pop()
    nxt = frame.info.instructions[frame.pc]
    if nxt.opname in ("POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE"):
        frame.stack.append(_truth(interp, frame, nxt, value, fall_through=frame.pc + 1))
    else:
        if interp.tracer.np_traced:
            from .numpy_trace import data_read

            data_read(interp, value, "bool()")
        frame.stack.append(bool(value))


@opcode("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT")
def op_jump(interp, frame, inst):
    _jump(frame, inst)


@opcode("POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE", until=(3, 12))
@opcode("POP_JUMP_IF_TRUE", since=(3, 12))
def op_pop_jump_if_true(interp, frame, inst):
    if _truth(interp, frame, inst, frame.stack.pop()):
        _jump(frame, inst)


@opcode("POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE", until=(3, 12))
@opcode("POP_JUMP_IF_FALSE", since=(3, 12))
def op_pop_jump_if_false(interp, frame, inst):
    if not _truth(interp, frame, inst, frame.stack.pop()):
        _jump(frame, inst)


@opcode("POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE", until=(3, 12))
@opcode("POP_JUMP_IF_NONE", since=(3, 12))
def op_pop_jump_if_none(interp, frame, inst):
    if frame.stack.pop() is None:
        _jump(frame, inst)


@opcode("POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE", until=(3, 12))
@opcode("POP_JUMP_IF_NOT_NONE", since=(3, 12))
def op_pop_jump_if_not_none(interp, frame, inst):
    if frame.stack.pop() is not None:
        _jump(frame, inst)


@opcode("JUMP_IF_TRUE_OR_POP", until=(3, 12))
def op_jump_if_true_or_pop(interp, frame, inst):
    if frame.stack[-1]:
        _jump(frame, inst)
    else:
        frame.stack.pop()


@opcode("JUMP_IF_FALSE_OR_POP", until=(3, 12))
def op_jump_if_false_or_pop(interp, frame, inst):
    if not frame.stack[-1]:
        _jump(frame, inst)
    else:
        frame.stack.pop()


# ---- iteration ---------------------------------------------------------------------------------
@opcode("GET_ITER")
def op_get_iter(interp, frame, inst):
    from .calls import interp_call, python_dunder

    obj = frame.stack.pop()
    if interp.tracer.np_traced and id(obj) in interp.tracer.np_traced and interp.tracer.recording:
        from .numpy_trace import PASS, iterate

        rows = iterate(interp, obj)  # a traced array's rows, each traced
        if rows is not PASS:
            frame.stack.append(rows)
            return
    fn = python_dunder(obj, "__iter__")
    process_order.note_iteration(interp.tracer, obj)
    frame.stack.append(iter(interp_call(interp, fn, (obj,), {})) if fn else iter(obj))


@opcode("FOR_ITER")
def op_for_iter(interp, frame, inst):
    it = frame.stack[-1]
    try:
        value = next(it)
    except StopIteration:
        frame.stack.pop()
        frame.pc = bc.for_iter_exhausted_index(frame.info, inst)
        return None
    frame.stack.append(value)


@opcode("GET_YIELD_FROM_ITER")
def op_get_yield_from_iter(interp, frame, inst):
    obj = frame.stack.pop()
    frame.stack.append(obj if _is_generator(obj) else iter(obj))


def _is_generator(obj) -> bool:
    import types

    from .interpreter import InterpGenerator

    return isinstance(obj, (InterpGenerator, types.GeneratorType))


@opcode("SEND")
def op_send(interp, frame, inst):
    value = frame.stack.pop()
    receiver = frame.stack[-1]
    try:
        if value is None and not hasattr(receiver, "send"):
            result = next(receiver)
        elif value is None and not _is_generator(receiver):
            result = next(receiver)
        else:
            result = receiver.send(value)
    except StopIteration as e:
        if bc.PY >= (3, 12):
            frame.stack.append(e.value)
            frame.pc = frame.info.target(inst)
            if frame.info.instructions[frame.pc].opname == "END_SEND":
                frame.pc += 1
                frame.stack.pop(-2)
        else:
            frame.stack.pop()
            frame.stack.append(e.value)
            frame.pc = frame.info.target(inst)
        return None
    frame.stack.append(result)


@opcode("END_SEND", since=(3, 12))
def op_end_send(interp, frame, inst):
    value = frame.stack.pop()
    frame.stack.pop()
    frame.stack.append(value)


@opcode("RETURN_VALUE")
def op_return_value(interp, frame, inst):
    return (RETURN, frame.stack.pop())


@opcode("YIELD_VALUE")
def op_yield_value(interp, frame, inst):
    return (YIELD, frame.stack.pop())


@opcode("RETURN_GENERATOR")
def op_return_generator(interp, frame, inst):
    frame.stack.append(None)  # the value of the first send(), popped by the next POP_TOP


# ---- exceptions --------------------------------------------------------------------------------
@opcode("RAISE_VARARGS")
def op_raise_varargs(interp, frame, inst):
    if inst.arg == 0:
        if interp.current_exc is None:
            raise RuntimeError("No active exception to reraise")
        raise interp.current_exc
    cause = frame.stack.pop() if inst.arg == 2 else NULL
    exc = frame.stack.pop()
    if isinstance(exc, type):
        exc = exc()
    if interp.split_parts:
        from .ops_except_star import raised_anew

        raised_anew(interp, exc)
    if cause is not NULL:
        if isinstance(cause, type):
            cause = cause()
        raise exc from cause
    raise exc


@opcode("RERAISE")
def op_reraise(interp, frame, inst):
    exc = frame.stack.pop()
    if inst.arg:
        frame.stack.pop()  # lasti
    raise exc


@opcode("PUSH_EXC_INFO")
def op_push_exc_info(interp, frame, inst):
    exc = frame.stack.pop()
    frame.stack.append(interp.current_exc)
    interp.current_exc = exc
    frame.stack.append(exc)


@opcode("POP_EXCEPT")
def op_pop_except(interp, frame, inst):
    interp.current_exc = frame.stack.pop()


@opcode("CHECK_EXC_MATCH")
def op_check_exc_match(interp, frame, inst):
    typ = frame.stack.pop()
    frame.stack.append(isinstance(frame.stack[-1], typ))


@opcode("CLEANUP_THROW", since=(3, 12))
def op_cleanup_throw(interp, frame, inst):
    exc = frame.stack.pop()
    frame.stack.pop()  # last_sent_val
    frame.stack.pop()  # sub_iter
    if isinstance(exc, StopIteration):
        if bc.PY < (3, 12):
            frame.stack.pop()
        frame.stack.append(exc.value)
        return None
    raise exc


# ---- with --------------------------------------------------------------------------------------
@opcode("BEFORE_WITH")
def op_before_with(interp, frame, inst):
    from .calls import _class_attr, interp_call

    mgr = frame.stack.pop()
    enter = _class_attr(type(mgr), "__enter__")
    exit_ = _class_attr(type(mgr), "__exit__")
    if enter is None or exit_ is None:
        raise TypeError(
            f"'{type(mgr).__name__}' object does not support the context manager protocol"
        )
    frame.stack.append(_bind(exit_, mgr))
    frame.stack.append(interp_call(interp, _bind(enter, mgr), (), {}))


def _bind(fn, obj):
    get = getattr(fn, "__get__", None)
    return get(obj, type(obj)) if get is not None else fn


@opcode("WITH_EXCEPT_START")
def op_with_except_start(interp, frame, inst):
    from .calls import interp_call

    exc = frame.stack[-1]
    exit_fn = frame.stack[-4]
    frame.stack.append(interp_call(interp, exit_fn, (type(exc), exc, exc.__traceback__), {}))
