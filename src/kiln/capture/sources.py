"""Sources: where a value the trace read came from, as an expression over the frame's inputs.

Takes nothing but describes paths: `L['x']`, `G['CONST']`, `L['self'].fc.weight`, a closure
cell, an item of a container, a ContextVar's value. Guards are written over sources; the
residual program fetches graph inputs through them. Each source prints two ways: `describe()`
for people and `expr(namer)` for the generated guard/residual code, where held objects become
`___cN` names.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from typing import Any


class Namer:
    """Gives generated code names for the Python objects it must refer to (`___c0`, ...)."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {}
        self._by_id: dict[int, str] = {}
        # source expression -> the entry's local its guard bound it to (guards.py, bound_expr)
        self.bound: dict[str, str] = {}
        self._count = 0  # the number of the next name

    def const(self, obj: Any, hint: str = "c") -> str:
        key = id(obj)
        if key in self._by_id:
            return self._by_id[key]
        name = f"___{hint}{self._count}"
        self._count += 1
        self._by_id[key] = name
        self.namespace[name] = obj
        return name

    def seed(self, name: str, obj: Any) -> None:
        """Name `obj` as a former namer did (code written then refers to it by `name`);
        names given after are numbered past it."""
        if id(obj) in self._by_id or name in self.namespace:
            raise ValueError(f"{name}: two names for one object, or one name twice")
        self._by_id[id(obj)] = name
        self.namespace[name] = obj
        number = re.search(r"(\d+)$", name)
        if number:
            self._count = max(self._count, int(number.group(1)) + 1)

    def bind(self, name: str, obj: Any) -> str:
        self.namespace[name] = obj
        return name


class Source:
    def describe(self) -> str:
        raise NotImplementedError

    def expr(self, namer: Namer) -> str:
        raise NotImplementedError

    def row(self) -> tuple[tuple, tuple, str] | None:
        """For a held value: what locates it as a row of a guard table (the row's values, the
        loop variables they bind, the expression over those variables, which depend only on
        the source's class); None otherwise."""
        return None

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True)
class LocalSource(Source):
    """An argument of the compiled function, by parameter name."""

    name: str

    def describe(self) -> str:
        return f"L[{self.name!r}]"

    def expr(self, namer: Namer) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class ConstSource(Source):
    """An object fixed for the life of the compiled function (the compiled module itself)."""

    obj: Any
    label: str

    def describe(self) -> str:
        if self.label.startswith(("L[", "G[", "G(")):  # a path below another source
            return self.label
        return f"L[{self.label!r}]"

    def expr(self, namer: Namer) -> str:
        return namer.const(self.obj, "self")

    def row(self) -> tuple[tuple, tuple, str]:
        return (self.obj,), ("___r_s",), "___r_s"


@dataclass(frozen=True, eq=False)
class GlobalSource(Source):
    """`globals_dict[name]` of the module a function was defined in."""

    globals_dict: dict
    name: str
    is_root: bool

    def describe(self) -> str:
        if self.is_root:
            return f"G[{self.name!r}]"
        return f"G({self.globals_dict.get('__name__', '?')})[{self.name!r}]"

    def expr(self, namer: Namer) -> str:
        return f"{namer.const(self.globals_dict, 'g')}[{self.name!r}]"


@dataclass(frozen=True, eq=False)
class CellSource(Source):
    """The contents of a closure cell of the compiled function (or of an inlined one)."""

    cell: Any
    name: str

    def describe(self) -> str:
        return f"closure[{self.name!r}]"

    def expr(self, namer: Namer) -> str:
        return f"{namer.const(self.cell, 'cell')}.cell_contents"


UNSET = type("Unset", (), {"__repr__": lambda self: "UNSET"})()


@dataclass(frozen=True, eq=False)
class ContextVarSource(Source):
    """What a `contextvars.ContextVar` holds in the caller's context (`UNSET` when nothing)."""

    var: Any

    def describe(self) -> str:
        return f"ContextVar({self.var.name!r}).get()"

    def expr(self, namer: Namer) -> str:
        return f"{namer.const(self.var, 'cv')}.get({namer.const(UNSET, 'unset')})"


@dataclass(frozen=True, eq=False)
class AttrSource(Source):
    base: Source
    name: str

    def describe(self) -> str:
        return f"{self.base.describe()}.{self.name}"

    def expr(self, namer: Namer) -> str:
        if self.name.isidentifier() and not keyword.iskeyword(self.name):
            if not self.name.startswith("__"):
                return f"{self.base.expr(namer)}.{self.name}"
        return f"getattr({self.base.expr(namer)}, {self.name!r})"


@dataclass(frozen=True, eq=False)
class InstanceDictSource(Source):
    """An attribute of a held object, read from its instance dictionary: what `obj.name`
    gives while the name is in `obj.__dict__` and the class has no data descriptor for it.
    nn.Module's `__getattr__` hook makes every `module.name` several times slower than a dict
    lookup, and a large model's guards read hundreds of them; a DICT guard checks on each call
    that the object still has the dictionary held here (see attributes.py)."""

    base: ConstSource
    name: str

    def describe(self) -> str:
        return f"{self.base.describe()}.{self.name}"

    def expr(self, namer: Namer) -> str:
        return f"{namer.const(self.base.obj.__dict__, 'd')}[{self.name!r}]"

    def row(self) -> tuple[tuple, tuple, str]:
        return (self.base.obj.__dict__, self.name), ("___r_sd", "___r_sk"), "___r_sd[___r_sk]"


@dataclass(frozen=True, eq=False)
class ItemSource(Source):
    """`base[key]`. A key that is no constant (a parameter keying an optimizer's state) is held
    by the generated code and read by people as `key_label`, the source it was read from."""

    base: Source
    key: Any
    key_label: str = ""
    # a subclass of list/dict/tuple is read through its C base class's `__getitem__` (`raw`):
    # guards and input fetches must not run an override (see containers.py)
    raw: Any = None

    def describe(self) -> str:
        if self.key_label:
            return f"{self.base.describe()}[{self.key_label}]"
        return f"{self.base.describe()}[{self.key!r}]"

    def expr(self, namer: Namer) -> str:
        k = self.key
        if isinstance(k, (int, str, bool, type(None))) or type(k) is float and k - k == 0:
            key = repr(k)
        else:
            key = namer.const(self.key, "k")
        if self.raw is not None:
            return f"{namer.const(self.raw, 'b')}.__getitem__({self.base.expr(namer)}, {key})"
        return f"{self.base.expr(namer)}[{key}]"


@dataclass(frozen=True, eq=False)
class WeakRefSource(Source):
    """What a `weakref.ref` read from `base` refers to now: `base()`."""

    base: Source

    def describe(self) -> str:
        return f"{self.base.describe()}()"

    def expr(self, namer: Namer) -> str:
        return f"{self.base.expr(namer)}()"
