"""The residual program: the generated Python function a cache entry runs on later calls.

Takes a finished trace (graph, placeholders with sources, guards, side effects, the traced
call's return value); gives one function with the compiled callable's signature that checks
every guard, fetches the graph inputs through their sources, calls the compiled graph, replays
side effects and rebuilds the return value. It is source code: printable (`KILN_LOGS=guards`)
and cheap to call.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import math
import types
from typing import Any

import torch
import torch.fx as fx

from .containers import builtin_base
from .guards import CONSTANT_TYPES
from .side_effects import Held
from .sources import Namer
from .symbolic import _Sym

MISS = type("Miss", (), {"__repr__": lambda self: "MISS"})()


class NotRebuildable(Exception):
    """A value the residual cannot reproduce on a later call (reason in the message)."""


class Rebuilder:
    """Writes an expression that rebuilds a value from graph outputs, sources and constants."""

    def __init__(self, tracer, namer: Namer) -> None:
        self.tracer = tracer
        self.namer = namer
        self.outputs: list[fx.Node] = []
        self._out_index: dict[fx.Node, int] = {}
        self.lets: list[str] = []  # `___tN = ...`: mutable objects built once, shared by name
        self._memo: dict[int, str] = {}
        self._held: list[Any] = []

    def _let(self, value: Any, expr: str) -> str:
        name = f"___t{len(self.lets)}"
        self.lets.append(f"{name} = {expr}")
        self._memo[id(value)] = name
        self._held.append(value)
        return name

    def memo_name(self, value: Any, name: str) -> None:
        """`value` is reachable as `name` in the residual (a token a replayed call returned)."""
        self._memo[id(value)] = name
        self._held.append(value)

    def output_of(self, node: fx.Node) -> str:
        if node not in self._out_index:
            self._out_index[node] = len(self.outputs)
            self.outputs.append(node)
        return f"___o[{self._out_index[node]}]"

    def expr(self, value: Any, depth: int = 0) -> str:
        if depth > 50:
            raise NotRebuildable("the value is nested too deeply")
        tracer = self.tracer
        if isinstance(value, torch.Tensor):
            node = tracer.tensor_nodes.get(id(value))
            if node is None:
                src = tracer.source_of(value)
                if src is not None:
                    return src.expr(self.namer)
                raise NotRebuildable("a tensor that no traced operation produced")
            if node.op == "placeholder":
                src = tracer.source_of(value)
                return src.expr(self.namer)
            if node.op == "get_attr":
                return self.namer.const(value)
            return self.output_of(node)
        if tracer.np_traced and id(value) in tracer.np_traced:
            from .numpy_trace import numpy_of, rebuild_parts

            src = tracer.source_of(value)
            if src is not None:  # an input (numpy_trace.lift_input): the same object
                return src.expr(self.namer)
            t, scalar = rebuild_parts(tracer, value)
            if id(value) in self._memo:
                return self._memo[id(value)]
            return self._let(value, f"{self.namer.const(numpy_of)}({self.expr(t)}, {scalar})")
        if isinstance(value, _Sym):
            node = value._node
            if node.op == "placeholder":
                return tracer.source_of_node(node).expr(self.namer)
            return self.output_of(node)
        if value is None or type(value) in (bool, int, str):
            return repr(value)
        if type(value) is float:
            return repr(value) if math.isfinite(value) else self.namer.const(value)
        if type(value) is torch.Size and any(isinstance(v, _Sym) for v in value):
            inner = "".join(f"{self.expr(v, depth + 1)}, " for v in value)
            return f"{self.namer.const(torch.Size)}(({inner}))"
        if isinstance(value, CONSTANT_TYPES):
            return self.namer.const(value)
        src = tracer.source_of(value)
        if src is not None:
            return src.expr(self.namer)
        if id(value) in self._memo:
            return self._memo[id(value)]
        t = type(value)
        if t in (list, dict, set, collections.deque) or (
            t is types.FunctionType and id(value) in tracer.inner_functions
        ):  # mutable, or made inside: one object, shared wherever it is reached
            return self._let(value, self._build(value, depth))
        if hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType)):
            if id(value) in tracer.created_objects or dataclasses.is_dataclass(value):
                return self._let(value, self._build(value, depth))
            if not isinstance(value, (types.FunctionType, types.MethodType)):
                return self.namer.const(value)  # an object from outside, by identity
        return self._build(value, depth)

    def _build(self, value: Any, depth: int) -> str:
        tracer = self.tracer
        t = type(value)
        if t is list:
            return "[" + ", ".join(self.expr(v, depth + 1) for v in value) + "]"
        if t is tuple:
            inner = ", ".join(self.expr(v, depth + 1) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        if t is dict:
            return (
                "{"
                + ", ".join(
                    f"{self.expr(k, depth + 1)}: {self.expr(v, depth + 1)}"
                    for k, v in value.items()
                )
                + "}"
            )
        if t is collections.deque:
            inner = ", ".join(self.expr(v, depth + 1) for v in value)
            return f"{self.namer.const(t)}([{inner}], {value.maxlen!r})"
        if t in (set, frozenset):
            inner = ", ".join(self.expr(v, depth + 1) for v in value)
            return f"{self.namer.const(t)}([{inner}])"
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
            inner = ", ".join(self.expr(v, depth + 1) for v in value)
            return f"{self.namer.const(t)}({inner})"
        if isinstance(value, tuple) and t.__module__.startswith("torch.return_types"):
            inner = ", ".join(self.expr(v, depth + 1) for v in value)
            return f"{self.namer.const(t)}(({inner},))"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self._dataclass(value, depth)
        if isinstance(value, dict):  # OrderedDict and friends
            items = ", ".join(
                f"({self.expr(k, depth + 1)}, {self.expr(v, depth + 1)})" for k, v in value.items()
            )
            return f"{self.namer.const(t)}([{items}])"
        if isinstance(value, types.MethodType):
            return f"getattr({self.expr(value.__self__, depth + 1)}, {value.__func__.__name__!r})"
        if isinstance(value, types.BuiltinMethodType) and not isinstance(
            value.__self__,
            (types.ModuleType, type(None)),  # (torch.from_numpy's is None)
        ):
            return f"getattr({self.expr(value.__self__, depth + 1)}, {value.__name__!r})"
        if isinstance(value, types.FunctionType):
            if id(value) not in tracer.inner_functions:
                return self.namer.const(value)
            code = self.namer.const(value.__code__, "code")
            g = self.namer.const(value.__globals__, "g")
            if not value.__closure__ and not value.__defaults__ and not value.__kwdefaults__:
                return f"___function({code}, {g})"  # e.g. a 3.11 comprehension
            return self._function(value, code, g, depth)
        if t.__module__ == "itertools" and hasattr(value, "__next__"):
            return self._iterator(value, depth)  # count, chain, islice...: their own recipe
        if t.__module__ == "builtins" and hasattr(value, "__next__") and t is not type:
            return self._iterator(value, depth)
        if isinstance(value, (type, types.ModuleType, types.BuiltinFunctionType)):
            return self.namer.const(value)
        if isinstance(value, torch.nn.Module):
            return self.namer.const(value)
        if hasattr(value, "__dict__") and not _slot_state(t):
            fields = ", ".join(f"{k!r}: {self.expr(v, depth + 1)}" for k, v in vars(value).items())
            return f"___rebuild_object({self.namer.const(t)}, {{{fields}}})"
        raise NotRebuildable(f"a {t.__qualname__} object made inside the compiled frame")

    def _function(self, fn: types.FunctionType, code: str, g: str, depth: int) -> str:
        """A function made inside the frame (`def`, lambda, closure): made again from its code,
        with new cells around the rebuilt contents of the cells the frame made (a closure
        over the compiled function's own cells keeps those cells)."""
        cells = []
        for cell in fn.__closure__ or ():
            if id(cell) not in self.tracer.inner_cells:
                cells.append(self.namer.const(cell, "cell"))
                continue
            try:
                contents = cell.cell_contents
            except ValueError:
                cells.append("___cell()")
                continue
            cells.append(f"___cell({self.expr(contents, depth + 1)})")
        closure = f"({''.join(c + ', ' for c in cells)})" if cells else "None"
        defaults = self.expr(fn.__defaults__, depth + 1)
        kwdefaults = self.expr(fn.__kwdefaults__, depth + 1)
        return (
            f"___make_function({code}, {g}, {fn.__name__!r}, {fn.__qualname__!r}, "
            f"{defaults}, {kwdefaults}, {closure})"
        )

    def _iterator(self, value: Any, depth: int) -> str:
        """A built-in iterator (range, list, zip, enumerate, dict views...) at its position,
        rebuilt through its own pickling recipe."""
        try:
            recipe = value.__reduce__()
        except TypeError as e:
            raise NotRebuildable(f"a {type(value).__name__} iterator ({e})") from None
        fn, args = recipe[0], recipe[1]
        state = recipe[2] if len(recipe) > 2 else None
        args_expr = self.expr(tuple(args), depth + 1)
        state_expr = self.expr(state, depth + 1)
        return f"___from_reduce({self.namer.const(fn)}, {args_expr}, {state_expr})"

    def _dataclass(self, value, depth: int) -> str:
        t = type(value)
        init_fields = [f for f in dataclasses.fields(value) if f.init]
        if isinstance(value, dict):  # transformers' ModelOutput: a dict and a dataclass at once
            kw = ", ".join(f"{k}={self.expr(v, depth + 1)}" for k, v in value.items())
            return f"{self.namer.const(t)}({kw})"
        state = {k: v for k, v in vars(value).items()}
        if set(state) == {f.name for f in init_fields}:
            fields = ", ".join(f"{k!r}: {self.expr(v, depth + 1)}" for k, v in state.items())
            return f"___rebuild_object({self.namer.const(t)}, {{{fields}}})"
        raise NotRebuildable(f"dataclass {t.__qualname__} with state beyond its fields")


def _slot_state(t: type) -> bool:
    """Does an instance of `t` keep state in slots (which `rebuild_object` does not restore)?
    `ABC` and friends declare empty `__slots__`: no state there."""
    for klass in t.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        if any(name not in ("__dict__", "__weakref__") for name in slots):
            return True
    return False


def make_function(code, g, name, qualname, defaults, kwdefaults, closure):
    fn = types.FunctionType(code, g, name, defaults, closure)
    fn.__qualname__ = qualname
    if kwdefaults:
        fn.__kwdefaults__ = kwdefaults
    return fn


def from_reduce(fn, args, state):
    obj = fn(*args)
    if state is not None:
        obj.__setstate__(state)
    return obj


def rebuild_object(cls, state: dict):
    obj = object.__new__(cls)
    obj.__dict__.update(state)
    return obj


def side_effect_lines(tracer, rb: Rebuilder) -> list[str]:
    lines = []
    namer = rb.namer
    tracer.context_vars.replay(rb)
    for eff in tracer.side_effects.effects:
        if eff.kind == "attr":
            target = eff.source.expr(namer)
            if hasattr(eff.target, eff.name):
                value = rb.expr(getattr(eff.target, eff.name))
                lines.append(f"setattr({target}, {eff.name!r}, {value})")
            else:
                lines.append(f"if hasattr({target}, {eff.name!r}): delattr({target}, {eff.name!r})")
        elif eff.kind == "tensor_attr":
            value = rb.expr(getattr(eff.target, eff.name, None))
            lines.append(f"setattr({rb.expr(eff.target)}, {eff.name!r}, {value})")
        elif eff.kind == "container":
            target = eff.source.expr(namer)
            obj = eff.target
            # the final contents, written through the built-in type's own methods: a subclass's
            # overrides ran in the trace, and what they did besides is replayed on its own
            # (read through the base type too: an override of `items` or `__iter__` must not
            # change what is written back)
            raw = builtin_base(type(obj))
            base = namer.const(raw)
            if isinstance(obj, list):
                contents = list(raw.__iter__(obj))
                lines.append(f"{base}.__setitem__({target}, slice(None), {rb.expr(contents)})")
            elif isinstance(obj, dict):
                pairs = raw.items(obj)
                items = ", ".join(f"({rb.expr(k)}, {rb.expr(v)})" for k, v in pairs)
                lines.append(
                    f"___items = [{items}]; ___d = {target}; {base}.clear(___d); "
                    f"{base}.update(___d, ___items)"
                )
            elif isinstance(obj, set):
                lines.append(
                    f"___items = {rb.expr(list(raw.__iter__(obj)))}; ___s = {target}; "
                    f"{base}.clear(___s); "
                    f"{base}.update(___s, ___items)"
                )
            else:
                raise NotRebuildable(f"mutation of a {type(obj).__name__} from outside")
        elif eff.kind == "global":
            g = namer.const(eff.target, "g")
            if eff.name in eff.target:
                lines.append(f"{g}[{eff.name!r}] = {rb.expr(eff.target[eff.name])}")
            else:
                lines.append(f"{g}.pop({eff.name!r}, None)")
        elif eff.kind == "cell":
            cell = namer.const(eff.target, "cell")
            lines.append(f"{cell}.cell_contents = {rb.expr(eff.target.cell_contents)}")
        elif eff.kind == "print":
            args = ", ".join(rb.expr(a) for a in eff.args)
            kw = ", ".join(f"{k}={rb.expr(v)}" for k, v in eff.kwargs.items())
            lines.append(f"print({', '.join(x for x in (args, kw) if x)})")
        elif eff.kind == "call":
            lines.append(_call_line(eff, rb))
    return lines


def _call_line(eff, rb: Rebuilder) -> str:
    def arg(v):
        return rb.namer.const(v.obj) if isinstance(v, Held) else rb.expr(v)

    parts = [arg(a) for a in eff.args]
    parts += [f"**{{{k!r}: {arg(v)}}}" for k, v in eff.kwargs.items()]
    return f"{rb.namer.const(eff.target, 'f')}({', '.join(parts)})"


def signature_text(sig: inspect.Signature) -> tuple[str, str, tuple, dict]:
    """Parameters of the entry function (no defaults written: they are assigned after),
    the call that forwards them, and the defaults to set."""
    parts, call = [], []
    defaults: list = []
    kwdefaults: dict = {}
    seen_posonly = False
    star = False
    P = inspect.Parameter
    params = list(sig.parameters.values())
    for p in params:
        if p.kind is P.POSITIONAL_ONLY:
            seen_posonly = True
        elif seen_posonly:
            parts.append("/")
            seen_posonly = False
        if p.kind is P.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            star = True
        elif p.kind is P.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        elif p.kind is P.KEYWORD_ONLY:
            if not star:
                parts.append("*")
                star = True
            parts.append(p.name)
            if p.default is not P.empty:
                kwdefaults[p.name] = p.default
        else:
            parts.append(p.name)
            if p.default is not P.empty:
                defaults.append(p.default)
    if seen_posonly:
        parts.append("/")
    for p in params:
        if p.kind is P.VAR_POSITIONAL:
            call.append(f"*{p.name}")
        elif p.kind is P.VAR_KEYWORD:
            call.append(f"**{p.name}")
        elif p.kind is P.KEYWORD_ONLY:
            call.append(f"{p.name}={p.name}")
        else:
            call.append(p.name)
    return ", ".join(parts), ", ".join(call), tuple(defaults), kwdefaults


def build_entry(
    params: str,
    defaults: tuple,
    kwdefaults: dict,
    guard_lines: list[str],
    input_exprs: list[str],
    has_graph: bool,
    effect_lines: list[str],
    result_expr: str,
    namer: Namer,
    name: str,
    tail: list[str] | None = None,
) -> tuple[types.FunctionType, str]:
    lines = [
        f"def {name}({params}):",
        "    try:",
        *[f"        {line}" for line in guard_lines],
        "    except Exception:",
        "        return ___MISS",
    ]
    if has_graph:
        lines.append(f"    ___o = ___graph({', '.join(input_exprs)})")
    lines += [f"    {line}" for line in effect_lines]
    if tail:
        lines += [f"    {line}" for line in tail]
    else:
        lines.append(f"    return {result_expr}")
    source = "\n".join(lines) + "\n"
    scope = dict(namer.namespace)
    scope["___MISS"] = MISS
    scope["___rebuild_object"] = rebuild_object
    scope["___from_reduce"] = from_reduce
    scope["___function"] = types.FunctionType
    scope["___make_function"] = make_function
    scope["___cell"] = types.CellType
    code = compile(source, f"<kiln entry {name}>", "exec")
    exec(code, scope)
    fn = scope[name]
    fn.__defaults__ = defaults or None
    fn.__kwdefaults__ = kwdefaults or None
    return fn, source
