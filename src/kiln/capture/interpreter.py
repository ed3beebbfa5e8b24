"""The symbolic interpreter: runs a frame's bytecode itself, on the call's real values.

Takes a Python function and its arguments; gives the function's result, computed exactly as
CPython would, while the tracer (tracer.py) records every torch call into a graph. User-level
functions the frame calls are run here too (their frames pushed on this interpreter's own
stack), so every value they read from outside is seen and guarded. Opcode handlers live in
ops_*.py, one file per concern; version differences in bytecode.py.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

from . import user_traceback
from .bytecode import RETURN, YIELD, CodeInfo, code_info  # noqa: F401  (RETURN: re-exported)
from .errors import KilnInternal

CO_VARARGS = inspect.CO_VARARGS
CO_VARKEYWORDS = inspect.CO_VARKEYWORDS
CO_GENERATOR = inspect.CO_GENERATOR
_STAR_ARGS = CO_VARARGS | CO_VARKEYWORDS
CO_ASYNC = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


class Frame:
    __slots__ = (
        "fn",
        "code",
        "info",
        "globals",
        "builtins",
        "locals",
        "stack",
        "pc",
        "kw_names",
        "parent",
        "namespace",
    )

    def __init__(self, fn: types.FunctionType, locals_: dict) -> None:
        self.fn = fn
        self.code = fn.__code__
        self.info: CodeInfo = code_info(self.code)
        self.globals = fn.__globals__
        b = self.globals.get("__builtins__", __builtins__)
        self.builtins = b if isinstance(b, dict) else b.__dict__
        self.locals = locals_
        self.stack: list[Any] = []
        self.pc = 0
        self.kw_names: tuple = ()
        self.parent: Frame | None = None  # the frame whose CALL receives our return value
        self.namespace: Any = None  # a class body's namespace (ops_classes.py)

    def location(self) -> tuple[str, int | None, str]:
        filename, line = self.info.location(max(self.pc - 1, 0))
        return filename, line, self.code.co_qualname


class Interpreter:
    def __init__(self, tracer, root_globals: dict) -> None:
        self.tracer = tracer
        self.root_globals = root_globals
        self.frames: list[Frame] = []
        self.current_exc: BaseException | None = None
        # exception groups `except*` split off (ops_except_star.py), by id: held while traced
        self.split_parts: dict[int, BaseException] = {}
        self.depth_limit = 200
        self.native_nesting = 0  # native calls in progress (a break inside one can't resume)
        self.root_frame: Frame | None = None
        self.root_resumable = False  # no module hooks around the root call

    def release(self) -> None:
        """The call is over: drop the frames and exceptions that still hold its values (the
        root frame's locals, a caught exception's traceback), which would otherwise wait in
        reference cycles for the garbage collector (Tracer.release)."""
        self.frames.clear()
        self.root_frame = None
        self.current_exc = None
        self.split_parts.clear()

    # ---- running frames -----------------------------------------------------------------------
    def run_frame(self, frame: Frame) -> tuple[int, Any]:
        if len(self.frames) > self.depth_limit:
            raise RecursionError("maximum recursion depth exceeded (kiln interpreter)")
        self.frames.append(frame)
        try:
            instructions = frame.info.instructions
            handlers = frame.info.handlers
            while True:
                idx = frame.pc
                inst = instructions[idx]
                frame.pc = idx + 1
                try:
                    r = handlers[idx](self, frame, inst)
                except KilnInternal:
                    raise
                except BaseException as e:
                    line = frame.info.location(idx)[1]
                    if self._dispatch_exception(frame, idx, e):
                        user_traceback.caught(e, frame, line)
                        continue
                    user_traceback.note_frame(e, frame, line, inst.opname == "RERAISE")
                    raise
                if r is not None:
                    return r
        finally:
            self.frames.pop()

    def _dispatch_exception(self, frame: Frame, idx: int, exc: BaseException) -> bool:
        entry = frame.info.exc_handler[idx]
        if entry is None:
            return False
        del frame.stack[entry.depth :]
        if entry.lasti:
            frame.stack.append(frame.info.instructions[idx].offset)
        frame.stack.append(exc)
        frame.pc = frame.info.index_of[entry.target]
        return True

    def call_function(self, fn: types.FunctionType, args: tuple, kwargs: dict, site=None) -> Any:
        """Run a Python function here (inline it): a new frame on this interpreter's stack."""
        code = fn.__code__
        if code.co_flags & CO_ASYNC:
            raise TypeError(
                f"kiln cannot trace async function {fn.__qualname__}; compile synchronous code"
            )
        frame = Frame(fn, bind_args(fn, args, kwargs))
        self.tracer.inlined.setdefault(id(fn), fn)  # the code this trace relied on (capture_cache)
        if self.root_frame is None and not self.frames:
            self.root_frame = frame
        frame.parent = site
        if code.co_flags & CO_GENERATOR:
            return InterpGenerator(self, frame)
        kind, value = self.run_frame(frame)
        return value

    def location(self) -> str:
        """`file:line in function` and the source text of the innermost user frame."""
        import linecache

        for frame in reversed(self.frames):
            filename, line, name = frame.location()
            if "/torch/" in filename and frame is not self.frames[0]:
                continue
            text = linecache.getline(filename, line or 0).strip() if line else ""
            return f"{filename}:{line} in {name}" + (f"\n    {text}" if text else "")
        return "<unknown>"


class InterpGenerator:
    """A generator whose frame runs on kiln's interpreter; native code may iterate it."""

    def __init__(self, interp: Interpreter, frame: Frame) -> None:
        self.interp = interp
        self.frame = frame
        self.started = False
        self.finished = False
        self.__name__ = frame.code.co_name
        self.__qualname__ = frame.code.co_qualname

    def __iter__(self):
        return self

    def __next__(self):
        return self.send(None)

    def send(self, value):
        if self.finished:
            raise StopIteration
        if self.started:
            self.frame.stack.append(value)
        elif value is not None:
            raise TypeError("can't send non-None value to a just-started generator")
        self.started = True
        try:
            kind, v = self.interp.run_frame(self.frame)
        except BaseException:
            self.finished = True
            raise
        if kind == YIELD:
            return v
        self.finished = True
        raise StopIteration(v)

    def throw(self, typ, val=None, tb=None):
        exc = (
            typ
            if isinstance(typ, BaseException)
            else (typ(val) if val is None or not isinstance(val, BaseException) else val)
        )
        if self.finished or not self.started:
            self.finished = True
            raise exc
        idx = self.frame.pc - 1
        if not self.interp._dispatch_exception(self.frame, idx, exc):
            self.finished = True
            raise exc
        try:
            kind, v = self.interp.run_frame(self.frame)
        except BaseException:
            self.finished = True
            raise
        if kind == YIELD:
            return v
        self.finished = True
        raise StopIteration(v)

    def close(self):
        if self.started and not self.finished:
            try:
                self.throw(GeneratorExit)
            except (GeneratorExit, StopIteration):
                pass
            else:
                raise RuntimeError("generator ignored GeneratorExit")
        self.finished = True


def bind_args(fn: types.FunctionType, args: tuple, kwargs: dict) -> dict:
    """Bind a call's arguments to `fn`'s parameters, with CPython's errors for bad calls."""
    code = fn.__code__
    nargs = code.co_argcount
    if not kwargs and len(args) == nargs and not code.co_flags & _STAR_ARGS:
        if not code.co_kwonlyargcount:  # the common call: every parameter given by position
            return dict(zip(code.co_varnames, args))
    nkw, nposonly = code.co_kwonlyargcount, code.co_posonlyargcount
    names = code.co_varnames
    qual = fn.__qualname__
    pos_names = names[:nargs]
    kwonly = names[nargs : nargs + nkw]
    i = nargs + nkw
    varargs = None
    if code.co_flags & CO_VARARGS:
        varargs, i = names[i], i + 1
    varkw = names[i] if code.co_flags & CO_VARKEYWORDS else None
    loc: dict[str, Any] = {}
    if len(args) > nargs and varargs is None:
        raise TypeError(
            f"{qual}() takes {nargs} positional argument{'s' if nargs != 1 else ''} but "
            f"{len(args)} were given"
        )
    for name, v in zip(pos_names, args):
        loc[name] = v
    if varargs is not None:
        loc[varargs] = tuple(args[nargs:])
    extra: dict[str, Any] = {}
    for k, v in kwargs.items():
        if k in kwonly or (k in pos_names and pos_names.index(k) >= nposonly):
            if k in loc:
                raise TypeError(f"{qual}() got multiple values for argument '{k}'")
            loc[k] = v
        elif varkw is not None:
            extra[k] = v
        else:
            raise TypeError(f"{qual}() got an unexpected keyword argument '{k}'")
    if varkw is not None:
        loc[varkw] = extra
    defaults = fn.__defaults__ or ()
    first_default = nargs - len(defaults)
    missing = []
    for j, name in enumerate(pos_names):
        if name not in loc:
            if j >= first_default:
                loc[name] = defaults[j - first_default]
            else:
                missing.append(name)
    if missing:
        raise TypeError(
            f"{qual}() missing {len(missing)} required positional argument"
            f"{'s' if len(missing) > 1 else ''}: " + ", ".join(repr(m) for m in missing)
        )
    kwdefaults = fn.__kwdefaults__ or {}
    for name in kwonly:
        if name not in loc:
            if name in kwdefaults:
                loc[name] = kwdefaults[name]
            else:
                raise TypeError(f"{qual}() missing 1 required keyword-only argument: '{name}'")
    return loc
