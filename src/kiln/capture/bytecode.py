"""Everything that differs between CPython versions' bytecode, in one place.

Takes a code object; gives a `CodeInfo`: its instructions (decoded once and cached), the
index of each jump target, the exception-table handler of each instruction, and the opcode
handler of each instruction. Handlers register with `@opcode(name, since=, until=)`, which
checks that the opcode exists in this interpreter's `dis.opmap` for the versions it claims.
On a Python whose bytecode kiln does not know (`UNSUPPORTED` says why) nothing registers:
`import kiln` still works and `kiln.compile` runs functions eagerly (api.py).
"""

from __future__ import annotations

import dis
import sys
from dataclasses import dataclass
from typing import Callable

PY = sys.version_info[:2]
SUPPORTED = ((3, 11), (3, 12), (3, 13))
UNSUPPORTED: str | None = (
    None
    if PY in SUPPORTED
    else f"kiln's bytecode interpreter knows Python 3.11, 3.12 and 3.13, not "
    f"{PY[0]}.{PY[1]}: kiln.compile returns what it is given and it runs eagerly (no graphs, "
    "no speed-up); use Python 3.11-3.13 to compile"
)

# The empty slot CPython's call convention puts beside a callable (PUSH_NULL, LOAD_GLOBAL and
# LOAD_ATTR with their low bit set): "no self argument".
NULL = type("NULL", (), {"__repr__": lambda self: "NULL"})()
# How a frame's run loop ended (the handlers of RETURN_VALUE / YIELD_VALUE say which).
RETURN = 0
YIELD = 1

_HANDLERS: dict[str, Callable] = {}


def opcode(*names: str, since: tuple[int, int] = (3, 11), until: tuple[int, int] = (3, 99)):
    """Register a handler for opcodes `names` on Python versions since <= v < until."""

    def register(fn: Callable) -> Callable:
        if UNSUPPORTED is None and since <= PY < until:
            for name in names:
                if name not in dis.opmap:
                    raise AssertionError(f"opcode {name} does not exist on Python {PY}")
                if name in _HANDLERS:
                    raise AssertionError(f"opcode {name} registered twice")
                _HANDLERS[name] = fn
        return fn

    return register


def handler(name: str) -> Callable | None:
    return _HANDLERS.get(name)


@dataclass(frozen=True)
class ExcEntry:
    start: int
    end: int
    target: int
    depth: int
    lasti: bool


class CodeInfo:
    """Decoded bytecode of one code object, shared by every frame that runs it."""

    def __init__(self, code) -> None:
        self.code = code
        self.instructions = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
        self.index_of = {inst.offset: k for k, inst in enumerate(self.instructions)}
        self.handlers = [_HANDLERS.get(i.opname, _unknown) for i in self.instructions]
        entries = [
            ExcEntry(e.start, e.end, e.target, e.depth, e.lasti)
            for e in dis._parse_exception_table(code)  # stable since 3.11
        ]
        self.exc_handler: list[ExcEntry | None] = []
        for inst in self.instructions:
            found = None
            for e in entries:
                if e.start <= inst.offset < e.end:
                    found = e
                    break
            self.exc_handler.append(found)

    def target(self, inst) -> int:
        """Instruction index a jump goes to (dis has already made relative jumps absolute)."""
        return self.index_of[inst.argval]

    def location(self, index: int) -> tuple[str, int | None]:
        inst = self.instructions[min(index, len(self.instructions) - 1)]
        line = inst.positions.lineno if inst.positions else None
        return self.code.co_filename, line


# Opcodes with no handler, and why (tests/capture/test_opcode_coverage.py checks that every
# other opcode the compiler emits has one). Meeting one makes the frame run eagerly with the
# reason; under fullgraph=True it is an error.
NOT_RUN = {
    # async code is refused before tracing (interpreter.CO_ASYNC)
    "ASYNC_GEN_WRAP": "async generators",
    "BEFORE_ASYNC_WITH": "`async with`",
    "END_ASYNC_FOR": "`async for`",
    "GET_AITER": "`async for`",
    "GET_ANEXT": "`async for`",
    "GET_AWAITABLE": "`await`",
    # never in a function's code
    "IMPORT_STAR": "`from m import *`, a SyntaxError outside module level",
    "PRINT_EXPR": "an expression statement of the interactive prompt",
    # the interpreter's own, never emitted by the compiler
    "CACHE": "inline cache entries",
    "RESERVED": "a reserved number",
    "INTERPRETER_EXIT": "CPython's interpreter exit",
    "ENTER_EXECUTOR": "CPython's tier-2 executors",
    "EXIT_INIT_CHECK": "a specialized __init__ call",
}


def _unknown(interp, frame, inst):
    from .errors import AbortTrace

    filename, line = frame.info.location(frame.pc - 1)
    what = NOT_RUN.get(inst.opname)
    raise AbortTrace(
        f"kiln's interpreter does not implement opcode {inst.opname}"
        + (f" ({what})" if what else "")
        + f" on Python {PY[0]}.{PY[1]}, at {filename}:{line}",
        where=interp.location(),
        hint="move this code into a helper function decorated with @kiln.disable (the rest of "
        "the function then compiles), or outside the compiled function",
    )


_cache: dict = {}


def code_info(code) -> CodeInfo:
    info = _cache.get(code)
    if info is None:
        info = _cache[code] = CodeInfo(code)
    return info


# ---- version differences in operands ---------------------------------------------------------

BINARY_OPS: list[str] = [sym for _, sym in getattr(dis, "_nb_ops", ())]  # index -> "+", ...


def load_global_pushes_null(inst) -> bool:
    return bool(inst.arg & 1)


# where CALL expects the NULL of a callable without self: below it before 3.13, above it from 3.13
NULL_BELOW_CALLABLE = PY < (3, 13)


def push_callable(stack: list, fn, self_obj=NULL) -> None:
    """Push a callable for CALL: `[NULL, fn]`/`[fn, self]` before 3.13, `[fn, NULL]`/`[fn, self]`
    from 3.13 (the NULL moved above the callable there)."""
    if self_obj is not NULL or not NULL_BELOW_CALLABLE:
        stack.append(fn)
        stack.append(self_obj)
    else:
        stack.append(NULL)
        stack.append(fn)


def push_result(frame, value) -> None:
    """Give a callee's return value to the frame whose instruction ran it, when a continuation
    resumes that frame: a method-form LOAD_ATTR whose property getter broke also owes CALL the
    NULL that 3.13 puts after the value."""
    frame.stack.append(value)
    if not NULL_BELOW_CALLABLE:
        inst = frame.info.instructions[frame.pc - 1]
        if inst.opname == "LOAD_ATTR" and load_attr_is_method(inst):
            frame.stack.append(NULL)


def pop_callable(stack: list) -> tuple:
    """Pop what push_callable pushed (arguments already popped): (callable, leading args)."""
    b = stack.pop()
    a = stack.pop()
    if not NULL_BELOW_CALLABLE:  # [callable, self_or_NULL]
        return (a, ()) if b is NULL else (a, (b,))
    return (b, ()) if a is NULL else (a, (b,))  # [callable_or_NULL, self_or_callable]


def pop_call_ex_callable(stack: list):
    """CALL_FUNCTION_EX's callable (its arguments already popped): `[NULL, fn]` before 3.13
    (3.11 may omit the NULL), `[fn, NULL]` on 3.13; returns (callable, leading args)."""
    if not NULL_BELOW_CALLABLE:
        return pop_callable(stack)
    fn = stack.pop()
    if stack and stack[-1] is NULL:
        stack.pop()
    return fn, ()


def load_attr_is_method(inst) -> bool:
    """3.12+: LOAD_ATTR's low bit asks for the method form (push NULL/self)."""
    return PY >= (3, 12) and bool(inst.arg & 1)


def super_attr_flags(inst) -> tuple[bool, bool]:
    """LOAD_SUPER_ATTR (3.12+): (method form, two-argument super)."""
    return bool(inst.arg & 1), bool(inst.arg & 2)


def for_iter_exhausted_index(info: CodeInfo, inst) -> int:
    """Where FOR_ITER continues once the iterator is exhausted (iterator already popped).

    3.11 jumps to the target. 3.12 jumps to END_FOR and skips it. 3.13 jumps to END_FOR, which
    is followed by POP_TOP (the pair pops the iterator and the missing value); we skip both.
    """
    k = info.target(inst)
    ins = info.instructions
    if PY >= (3, 12) and ins[k].opname == "END_FOR":
        k += 1
        if PY >= (3, 13) and ins[k].opname == "POP_TOP":
            k += 1
    return k


def make_function_flags(inst) -> int:
    return inst.arg if PY < (3, 13) else 0
