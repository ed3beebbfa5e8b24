"""Recipes: outside objects a cache entry refers to, named so that another process finds them.

Takes the objects a finished trace's guards, graph inputs and result hold (the compiled module,
its submodules and parameters, globals dictionaries, classes, functions, library modules);
gives `Encoder` (value -> plain data; `Uncacheable` when an object has no name that means the
same object in another process) and `Resolver` (plain data -> the objects of this process,
`Uncacheable` when one is missing or not the same kind of object). The capture cache
(capture_cache.py) stores what `Encoder` gives and rebuilds its entry from what `Resolver`
finds.

Why each kind is sound:

* a held object of the compiled module's tree (a submodule, parameter or buffer, or one of
  their `__dict__`s or structure dictionaries) is named by *every* path that reaches it from
  the module (named_modules without removing duplicates); another process finds it by those
  paths, all of which must lead to one object, of the same class, and objects that were
  distinct must still be distinct (tied weights stay tied, untied ones untied);
* library modules by their name in `sys.modules`, globals dictionaries as a module's
  `__dict__`; classes and functions by module and qualified name, checked now to lead back to
  the very object; a Python function also by a digest of its compiled code (file, line and
  name included) and its plain defaults, so an edited function is another function;
* plain immutable values (numbers, strings, dtypes, devices, sizes) by value.

Anything else (an object held by identity with no such name: a config instance, a closure
over an object) is `Uncacheable`, and the entry is not kept.
"""

from __future__ import annotations

import enum
import importlib
import sys
import types
from typing import Any

import torch

from ..pycode import code_digest
from .module_tree import STRUCTURE

PLAIN = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    type(Ellipsis),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


class Uncacheable(Exception):
    """What the entry holds cannot be found again in another process (why in the message)."""


def function_digest(fn: types.FunctionType) -> str:
    """A Python function as another process must find it: its compiled code (with nested
    functions' code, file, first line and qualified name) and its defaults (plain values, or
    functions and classes by name, a function also by its code)."""
    kw = sorted((fn.__kwdefaults__ or {}).items())
    try:
        defaults = _default_text((fn.__defaults__ or (), kw))
    except Uncacheable:
        raise Uncacheable(f"{fn.__qualname__} has defaults that are not plain values") from None
    return f"{code_digest(fn.__code__)}:{defaults}"


def _default_text(value: Any, depth: int = 0) -> str:
    if type(value) in (tuple, list) and depth < 4:
        inner = ",".join(_default_text(v, depth + 1) for v in value)
        return f"{type(value).__name__}({inner})"
    if type(value) in PLAIN or type(value) is torch.Size:
        return repr(value)
    if isinstance(value, (types.FunctionType, type)):
        name = f"{value.__module__}.{value.__qualname__}"
        if isinstance(value, types.FunctionType):
            name += ":" + code_digest(value.__code__)
        return name
    raise Uncacheable(f"a default is a {type(value).__qualname__}")


def by_name(module: str, qualname: str) -> Any:
    """The object `module.qualname` names in this process (a method from its class's dict, so
    that a staticmethod or classmethod gives its function)."""
    if "<" in qualname:
        raise Uncacheable(f"{module}.{qualname} has no importable name")
    try:
        obj: Any = sys.modules.get(module) or importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure: not found
        raise Uncacheable(f"module {module} does not import ({type(e).__name__})") from None
    for part in qualname.split("."):
        if isinstance(obj, type) and part in obj.__dict__:
            obj = obj.__dict__[part]
            if isinstance(obj, (staticmethod, classmethod)):
                obj = obj.__func__
        else:
            obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            raise Uncacheable(f"{module}.{qualname} is not there")
    return obj


_MISSING = object()


def _tree_paths(root: torch.nn.Module) -> dict[int, tuple[Any, list[tuple[str, str]]]]:
    """id -> (object, every path reaching it) for the modules, parameters, buffers, their
    instance dictionaries and structure dictionaries of `root`'s tree."""
    found: dict[int, tuple[Any, list[tuple[str, str]]]] = {}

    def add(obj: Any, kind: str, path: str) -> None:
        found.setdefault(id(obj), (obj, []))[1].append((kind, path))

    for path, mod in root.named_modules(remove_duplicate=False):
        add(mod, "m", path)
        add(mod.__dict__, "d", path)
        for name in STRUCTURE:
            add(mod.__dict__[name], name, path)
        for name, p in mod._parameters.items():
            if p is not None:
                add(p, "p", f"{path}.{name}" if path else name)
        for name, b in mod._buffers.items():
            if b is not None:
                add(b, "b", f"{path}.{name}" if path else name)
    return found


def _follow(root: torch.nn.Module, kind: str, path: str) -> Any:
    if kind in ("p", "b"):
        owner, _, name = path.rpartition(".")
        mod = root.get_submodule(owner)
        table = mod._parameters if kind == "p" else mod._buffers
        return table[name]
    mod = root.get_submodule(path)
    if kind == "m":
        return mod
    if kind == "d":
        return mod.__dict__
    return mod.__dict__[kind]  # a structure dictionary


class Encoder:
    """Values -> plain data. Objects go into `objects` (a list of recipes), referenced by
    index, so one object is one entry however often it is referred to."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.objects: list[tuple] = []
        self._index: dict[int, int] = {}
        self._keep: list[Any] = []
        module = root if isinstance(root, torch.nn.Module) else getattr(root, "__self__", None)
        self.tree = _tree_paths(module) if isinstance(module, torch.nn.Module) else {}
        self.tree_root = module if isinstance(module, torch.nn.Module) else None
        self.functions: list[types.FunctionType] = []  # run inline: their cells have names

    def value(self, v: Any) -> tuple:
        t = type(v)
        if t in PLAIN:
            return ("v", v)
        if t is torch.Size:
            return ("v", v)
        if t is tuple:
            return ("t", [self.value(x) for x in v])
        if t is frozenset:
            return ("fs", [self.value(x) for x in v])
        if t is slice:
            return ("sl", [self.value(v.start), self.value(v.stop), self.value(v.step)])
        return ("o", self.obj(v))

    def obj(self, o: Any) -> int:
        i = self._index.get(id(o))
        if i is None:
            recipe = self._recipe(o)
            i = self._index[id(o)] = len(self.objects)
            self.objects.append(recipe)
            self._keep.append(o)
        return i

    def _recipe(self, o: Any) -> tuple:
        if o is self.root:
            return ("root", _type_name(o) if isinstance(o, torch.nn.Module) else None)
        if self.tree_root is not None and o is self.tree_root:
            return ("self", _type_name(o))
        hit = self.tree.get(id(o))
        if hit is not None:
            return ("tree", hit[1], _type_name(o) if not isinstance(o, dict) else None)
        if isinstance(o, types.ModuleType):
            if sys.modules.get(o.__name__) is not o:
                raise Uncacheable(f"module {o.__name__} is not the one sys.modules holds")
            return ("module", o.__name__)
        if type(o) is dict and isinstance(o.get("__name__"), str):
            mod = sys.modules.get(o["__name__"])
            if mod is not None and mod.__dict__ is o:
                return ("globals", o["__name__"])
        if isinstance(o, types.CellType):
            return self._cell(o)
        if isinstance(o, enum.Enum) and type(o).__members__.get(o.name) is o:
            return ("enum", self.obj(type(o)), o.name)  # a member of a named enum class
        if isinstance(o, types.CodeType):  # a function's code: that of a named function
            for fn in self.functions:
                if fn.__code__ is o:
                    return ("code", self.obj(fn))
            module = _module_of_file(o.co_filename)
            if module is not None:
                try:
                    fn = by_name(module, o.co_qualname)
                except Uncacheable:
                    fn = None
                if isinstance(fn, types.FunctionType) and fn.__code__ is o:
                    return ("code", self.obj(fn))
            raise Uncacheable(f"it holds the code of {o.co_qualname}, of no named function")
        if isinstance(o, torch._ops.OpOverload):
            return ("op", o._schema.name, o._overloadname)
        if isinstance(o, (type, types.FunctionType, types.BuiltinFunctionType)):
            return _named(o)
        raise Uncacheable(f"it holds a {type(o).__qualname__} by identity ({_short(o)})")

    def _cell(self, cell: Any) -> tuple:
        """A closure cell of the compiled function, or of a function run inline that has a
        name (a decorator's wrapper reading the function it wraps)."""
        root = getattr(self.root, "__func__", self.root)
        for i, c in enumerate(getattr(root, "__closure__", None) or ()):
            if c is cell:
                return ("cell", None, i)
        for fn in self.functions:
            for i, c in enumerate(fn.__closure__ or ()):
                if c is cell:
                    return ("cell", self.obj(fn), i)
        raise Uncacheable("it reads a closure cell of a function with no importable name")


def _named(o: Any) -> tuple:
    """A class or function by a module and name that lead back to it (a C function by its
    module and plain name when its qualified name is its C class's: `torch.relu`)."""
    module = getattr(o, "__module__", None)
    qualname = getattr(o, "__qualname__", None)
    names = [(module, qualname)]
    if isinstance(o, type) and o in _TYPES_NAMES:
        names.append(("types", _TYPES_NAMES[o]))  # NoneType, FunctionType, CodeType, ...
    if isinstance(o, types.BuiltinFunctionType):
        names.append((module, o.__name__))
        owner = o.__self__
        if isinstance(owner, types.ModuleType):
            names.append((owner.__name__, o.__name__))
    for module, qualname in names:
        if not isinstance(module, str) or not isinstance(qualname, str):
            continue
        try:
            found = by_name(module, qualname)
        except Uncacheable:
            continue
        digest = function_digest(o) if isinstance(o, types.FunctionType) else None
        if found is o:
            return ("ref", module, qualname, digest)
        if isinstance(found, property):  # a property's getter or setter: its function
            for part in ("fget", "fset", "fdel"):
                if getattr(found, part) is o:
                    return ("ref", module, qualname, digest, [part])
        cells = _through_closures(found, o) if digest is not None else None
        if cells is not None:  # a decorated function: what its wrapper's closure holds
            return ("ref", module, qualname, digest, cells)
    raise Uncacheable(f"{_short(o)} has no module and name that lead back to it")


def _module_of_file(filename: str) -> str | None:
    """The name of the loaded module whose source file is `filename`."""
    for name, mod in list(sys.modules.items()):
        if getattr(mod, "__file__", None) == filename:
            return name
    return None


_TYPES_NAMES = {v: k for k, v in vars(types).items() if isinstance(v, type)}


def _through_closures(start: Any, target: Any, depth: int = 3) -> list[int] | None:
    """The closure-cell indices that lead from function `start` (a decorator's wrapper,
    which `functools.wraps` names as the function it wraps) to `target`, or None."""
    if depth == 0 or not isinstance(start, types.FunctionType):
        return None
    for i, cell in enumerate(start.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if value is target:
            return [i]
        rest = _through_closures(value, target, depth - 1)
        if rest is not None:
            return [i, *rest]
    return None


def _type_name(o: Any) -> tuple:
    t = type(o)
    return _named(t)


def _short(o: Any) -> str:
    name = getattr(o, "__qualname__", None) or type(o).__qualname__
    return str(name)[:60]


class Resolver:
    """Plain data -> this process's objects, for the compiled callable's `root`."""

    def __init__(self, root: Any, objects: list[tuple]) -> None:
        self.root = root
        module = root if isinstance(root, torch.nn.Module) else getattr(root, "__self__", None)
        self.tree_root = module if isinstance(module, torch.nn.Module) else None
        self.objects: list[Any] = []
        for r in objects:  # in order: a recipe refers only to objects before it
            self.objects.append(self._resolve(r))
        tree = [o for r, o in zip(objects, self.objects) if r[0] in ("tree", "root", "self")]
        if len({id(o) for o in tree}) != len(tree):
            raise Uncacheable("objects of the module tree that were distinct are shared now")

    def value(self, data: tuple) -> Any:
        tag, v = data
        if tag == "v":
            return v
        if tag == "t":
            return tuple(self.value(x) for x in v)
        if tag == "fs":
            return frozenset(self.value(x) for x in v)
        if tag == "sl":
            return slice(*(self.value(x) for x in v))
        return self.objects[v]

    def _resolve(self, r: tuple) -> Any:
        kind = r[0]
        if kind == "root":
            if r[1] is not None:
                _check_type(self.root, r[1])
            return self.root
        if kind == "self":
            if self.tree_root is None:
                raise Uncacheable("the compiled callable has no module now")
            _check_type(self.tree_root, r[1])
            return self.tree_root
        if kind == "tree":
            if self.tree_root is None:
                raise Uncacheable("the compiled callable has no module now")
            try:
                found = [_follow(self.tree_root, k, p) for k, p in r[1]]
            except (AttributeError, KeyError) as e:
                raise Uncacheable(f"the module tree changed ({e})") from None
            if any(f is not found[0] for f in found):
                raise Uncacheable(f"paths {[p for _, p in r[1]]} no longer reach one object")
            if r[2] is not None:
                _check_type(found[0], r[2])
            return found[0]
        if kind == "module":
            try:
                return sys.modules.get(r[1]) or importlib.import_module(r[1])
            except Exception as e:  # noqa: BLE001
                raise Uncacheable(f"module {r[1]} does not import ({type(e).__name__})") from None
        if kind == "globals":
            return self._resolve(("module", r[1])).__dict__
        if kind == "cell":
            fn = getattr(self.root, "__func__", self.root) if r[1] is None else self.objects[r[1]]
            cells = getattr(fn, "__closure__", None) or ()
            if r[2] >= len(cells):
                raise Uncacheable("the compiled function has other closure cells now")
            return cells[r[2]]
        if kind == "enum":
            member = self.objects[r[1]].__members__.get(r[2])
            if member is None:
                raise Uncacheable(f"enum member {r[2]} is gone")
            return member
        if kind == "code":
            return self.objects[r[1]].__code__
        if kind == "op":
            packet = getattr(getattr(torch.ops, r[1].split("::")[0]), r[1].split("::")[1])
            return getattr(packet, r[2] or "default")
        if kind == "ref":
            return resolve_named(r)
        raise Uncacheable(f"unknown recipe {kind!r}")


def resolve_named(r: tuple) -> Any:
    """A ("ref", module, qualname, digest) recipe: the object, its function's code unchanged."""
    module, qualname, digest = r[1:4]
    obj = by_name(module, qualname)
    for i in r[4] if len(r) > 4 else ():
        if isinstance(i, str):  # a property's function
            if not isinstance(obj, property):
                raise Uncacheable(f"{module}.{qualname} is no property now")
            obj = getattr(obj, i)
            continue
        cells = getattr(obj, "__closure__", None) or ()
        if i >= len(cells):
            raise Uncacheable(f"the wrapper {module}.{qualname} changed")
        try:
            obj = cells[i].cell_contents
        except ValueError:
            raise Uncacheable(f"the wrapper {module}.{qualname} changed") from None
    if digest is not None:
        if not isinstance(obj, types.FunctionType) or function_digest(obj) != digest:
            raise Uncacheable(f"{module}.{qualname} changed")
    return obj


def _check_type(obj: Any, type_recipe: tuple) -> None:
    want = resolve_named(type_recipe)
    if type(obj) is not want:
        raise Uncacheable(
            f"an object of the module tree is a {type(obj).__qualname__}, was {type_recipe[2]}"
        )
