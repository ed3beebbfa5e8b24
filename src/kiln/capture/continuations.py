"""Graph breaks that resume: end the graph, do one step in plain Python, continue in a
continuation that is captured on its first call like any frame.

Takes the interpreter's state at a break (the chain of frames from the compiled function down
to the innermost inlined call, each with its pc, locals and stack) and gives: the flat list of
live values, a spec that can rebuild the frames from them, and a `Continuation`, a compiled
callable keyed by the resume point whose entries are guarded and cached like a frame's. No
bytecode is generated: a continuation's first call traces by *running* kiln's interpreter from
the saved state, and later calls run its residual program.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

from . import bytecode as bc
from . import user_traceback
from .bytecode import NULL
from .errors import GraphBreakAt, KilnInternal, ResumableBreak  # noqa: F401
from .interpreter import Frame

CALL_OPS = {"CALL", "CALL_KW", "CALL_FUNCTION_EX"}
# instructions whose callee's return value goes straight onto the caller's stack: a property
# getter run by an attribute load resumes into its caller exactly as a call does
RESULT_OPS = CALL_OPS | {"LOAD_ATTR", "LOAD_METHOD"}
# the load or store is the step (ops_basic: a data-dependent size read, `t.requires_grad = True`)
ATTR_OPS = {"LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR"}
BRANCH_OPS = {
    "POP_JUMP_IF_TRUE",
    "POP_JUMP_IF_FALSE",
    "POP_JUMP_FORWARD_IF_TRUE",
    "POP_JUMP_FORWARD_IF_FALSE",
    "POP_JUMP_BACKWARD_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_FALSE",
}


def can_resume(interp) -> bool:
    """Is the current instruction of the innermost frame a point we can split the graph at?"""
    if not interp.frames or not getattr(interp, "root_resumable", False):
        return False
    inner = interp.frames[-1]
    op = inner.info.instructions[inner.pc - 1].opname
    if op == "TO_BOOL":  # 3.13: the condition of the branch that follows (ops_control.py)
        op = inner.info.instructions[inner.pc].opname
    if op in CALL_OPS:
        if interp.native_nesting > 1:
            return False
    elif op in BRANCH_OPS or op in ATTR_OPS:  # an attribute load: a size that depends on data
        if interp.native_nesting > 0:
            return False
    else:
        return False
    return chain_of(interp, inner) is not None


def chain_of(interp, inner: Frame) -> list[Frame] | None:
    chain = [inner]
    f = inner
    while f is not interp.root_frame:
        if f.parent is None:
            return None
        parent = f.parent
        if parent.info.instructions[parent.pc - 1].opname not in RESULT_OPS:
            return None
        chain.append(parent)
        f = parent
    chain.reverse()
    inner_fns = interp.tracer.inner_functions
    if any(id(fr.fn) in inner_fns for fr in chain):
        return None
    return chain


@dataclass(frozen=True)
class FrameSpec:
    fn: types.FunctionType
    pc: int
    local_names: tuple[str, ...]
    cell_names: tuple[str, ...]  # cells made in the frame: their contents travel as values
    empty_cells: tuple[str, ...]
    free_names: tuple[str, ...]  # the function's own closure cells, fetched again by name
    stack_nulls: tuple[bool, ...]

    def key(self) -> tuple:
        return (
            self.fn.__code__,
            self.pc,
            self.local_names,
            self.cell_names,
            self.empty_cells,
            self.free_names,
            self.stack_nulls,
        )


class NotResumable(Exception):
    pass


class _ReduceMark:
    """Marks `(mark, fn, args, state)`: a built-in iterator taken apart into the sequence it
    walks and its position, so the sequence's items are guarded and lifted like any value."""

    def __repr__(self) -> str:
        return "ITER"


REDUCE = _ReduceMark()


def _take_apart(v):
    if type(v).__module__ == "builtins" and hasattr(v, "__next__") and not isinstance(v, type):
        try:
            recipe = v.__reduce__()
        except TypeError as e:
            raise NotResumable(f"a {type(v).__name__} is live at the break ({e})") from None
        fn, args = recipe[0], recipe[1]
        state = recipe[2] if len(recipe) > 2 else None
        return (REDUCE, fn, tuple(_take_apart(a) for a in args), state)
    return v


def _put_together(v):
    if type(v) is tuple and len(v) == 4 and v[0] is REDUCE:
        _, fn, args, state = v
        obj = fn(*(_put_together(a) for a in args))
        if state is not None:
            obj.__setstate__(state)
        return obj
    return v


def snapshot(tracer, chain: list[Frame]) -> tuple[list[FrameSpec], list[Any]]:
    """Specs and flat live values of a chain of frames, as they are right now."""
    specs, values = [], []
    for f in chain:
        closure = {id(c): name for name, c in zip(f.code.co_freevars, f.fn.__closure__ or ())}
        local_names, cell_names, empty, free = [], [], [], []
        local_vals, cell_vals = [], []
        for name, v in f.locals.items():
            if isinstance(v, types.CellType):
                if id(v) in closure:
                    free.append(name)
                elif id(v) in tracer.inner_cells:
                    try:
                        cell_vals.append(v.cell_contents)
                        cell_names.append(name)
                    except ValueError:
                        empty.append(name)
                else:
                    raise NotResumable(f"local {name!r} holds a closure cell from elsewhere")
            elif v is not NULL:
                local_names.append(name)
                local_vals.append(_take_apart(v))
        nulls = tuple(v is NULL for v in f.stack)
        if any(isinstance(v, types.CellType) for v in f.stack):
            raise NotResumable("a closure cell is on the value stack")
        specs.append(
            FrameSpec(
                f.fn, f.pc, tuple(local_names), tuple(cell_names), tuple(empty), tuple(free), nulls
            )
        )
        values += local_vals + cell_vals + [_take_apart(v) for v in f.stack if v is not NULL]
    return specs, values


def with_pc(specs: list[FrameSpec], pc: int, push: bool) -> list[FrameSpec]:
    last = specs[-1]
    nulls = last.stack_nulls + ((False,) if push else ())
    new_last = FrameSpec(
        last.fn, pc, last.local_names, last.cell_names, last.empty_cells, last.free_names, nulls
    )
    return [*specs[:-1], new_last]


def build_frames(tracer, specs: list[FrameSpec], values: list[Any]) -> list[Frame]:
    """Frames ready to run again, from specs and values (cells made anew around contents)."""
    frames: list[Frame] = []
    it = iter(values)
    for spec in specs:
        loc: dict[str, Any] = {}
        for name in spec.local_names:
            loc[name] = _put_together(next(it))
        for name in spec.cell_names:
            cell = types.CellType(next(it))
            tracer.inner_cells.add(id(cell))
            tracer.keepalive.append(cell)
            loc[name] = cell
        for name in spec.empty_cells:
            cell = types.CellType()
            tracer.inner_cells.add(id(cell))
            tracer.keepalive.append(cell)
            loc[name] = cell
        closure = dict(zip(spec.fn.__code__.co_freevars, spec.fn.__closure__ or ()))
        for name in spec.free_names:
            loc[name] = closure[name]
        f = Frame(spec.fn, loc)
        f.pc = spec.pc
        f.stack = [NULL if is_null else _put_together(next(it)) for is_null in spec.stack_nulls]
        f.parent = frames[-1] if frames else None
        frames.append(f)
    return frames


def resume_chain(interp, frames: list[Frame], exc: BaseException | None = None) -> Any:
    """Run the innermost frame to its end, hand its value (or exception) to its caller's
    CALL, and so on up to the compiled function's own frame; its return value is the result."""
    result: Any = None
    pending = exc
    for i in range(len(frames) - 1, -1, -1):
        f = frames[i]
        if i == len(frames) - 1:
            if pending is not None:
                if not _deliver(interp, f, pending):
                    continue
                pending = None
        elif pending is None:
            bc.push_result(f, result)
        else:
            if not _deliver(interp, f, pending):
                continue
            pending = None
        try:
            _kind, result = interp.run_frame(f)
        except KilnInternal:
            raise
        except BaseException as e:  # noqa: BLE001 - delivered to the caller frame
            pending = e
    if pending is not None:
        raise pending
    return result


def _deliver(interp, f: Frame, exc: BaseException) -> bool:
    """Raise `exc` in frame `f` at its current instruction: True if a handler there takes it."""
    line = f.info.location(f.pc - 1)[1]
    if interp._dispatch_exception(f, f.pc - 1, exc):
        user_traceback.caught(exc, f, line)
        return True
    user_traceback.note_frame(exc, f, line)
    return False


def continuation_key(specs: list[FrameSpec]) -> tuple:
    return tuple(s.key() for s in specs)


def branch_targets(frame: Frame, inst) -> tuple[int, int, bool]:
    """(jump target index, fall-through index, jumps when truthy) of a branch instruction."""
    target = frame.info.target(inst)
    return target, frame.pc, "TRUE" in inst.opname
