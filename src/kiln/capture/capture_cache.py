"""The capture cache: a frame's trace kept on disk, so that a new process skips capture.

Takes, at the end of a trace that captured one whole graph (frontend.py `_install`), the
graph, the guards, the graph inputs' sources and the return value's rebuild code; gives bytes
for the store `kiln.compile` hands the compiled callable (api.py: the compiled-artifact store,
runtime/artifacts.py, which checksums, writes atomically and evicts). A later process's first
call loads them (`load`), and frontend.py rebuilds the entry from them exactly as `_install`
builds one (guards -> check code, sources -> input fetches); the graph is handed to the backend
on the entry's first call, whose compiled-artifact cache (backends/warm.py) then loads the
compiled graph instead of compiling it.

The key (`frame_key`): the compiled function's code (its module, qualified name, a digest of
its compiled code and defaults), the module class it belongs to, the options, kiln's source
digest, torch's and Python's versions. What the trace relied on beyond that is in the entry:

* the guards, written over source paths from the frame's roots (arguments, `self`, globals,
  closure cells); the objects they hold are named by `recipes.Encoder` (the module tree by
  every path, library objects by name, functions by name and code); the load finds them again
  (`recipes.Resolver`) or the entry is not used; every guard then runs on the call, as in the
  process that traced it, and the entry is used only when they all hold;
* the functions the trace ran inline, each by name and a digest of its code and defaults: an
  edited function, or one that resolves to another object, refuses the entry;
* the module-structure guard is made anew for the objects found (one process's version
  number means nothing in another).

Kept only what can be made sound now: one graph, no graph break, no side effects to replay
(stores, prints, context variables), static shapes (no dynamic dimension or symbolic number),
tensors as graph inputs, a backend named by a string. Anything else is not kept and says why
(`KILN_LOGS=capture_cache`); so does every load that is refused. Any failure of a load means
a normal capture.
"""

from __future__ import annotations

import hashlib
import pickle
import sys
import types
from typing import Any

import torch

from .. import logs
from ..contracts import CaptureInfo
from ..version import source_digest
from . import graph_data, module_tree
from .guards import Guard
from .recipes import Encoder, Resolver, Uncacheable, function_digest, resolve_named
from .sources import (
    AttrSource,
    CellSource,
    ConstSource,
    GlobalSource,
    InstanceDictSource,
    ItemSource,
    LocalSource,
    Source,
    WeakRefSource,
)

FORMAT = "kiln-capture-2"
# this process's capture-cache loads (hits), refused or absent loads, entries written, frames
# not kept (benchmarks and tests read it)
STATS = {"hits": 0, "misses": 0, "stored": 0, "not_cached": 0}


def say(message: str) -> None:
    logs.log("capture_cache", message)


def frame_key(cf: Any) -> str:
    """The store key of a compiled callable's frame (see the module doc)."""
    root = cf.root_callable
    if isinstance(root, torch.nn.Module):
        fn, owner = type(root).forward, type(root)
    elif isinstance(root, types.MethodType):
        fn, owner = root.__func__, type(root.__self__)
    else:
        fn, owner = root, None
    if not isinstance(fn, types.FunctionType):
        raise Uncacheable(f"{cf.label} is not a Python function")
    opts = cf.opts
    if not isinstance(opts.backend, str):
        raise Uncacheable("its backend is a callable (only named backends are kept)")
    config = repr(sorted(opts.config.items()))
    if " at 0x" in config:
        raise Uncacheable("an option's value is an object")
    owner_name = f"{owner.__module__}.{owner.__qualname__}" if owner is not None else ""
    module = root if isinstance(root, torch.nn.Module) else getattr(root, "__self__", None)
    if isinstance(module, torch.nn.Module):  # one class wrapping different models: apart
        owner_name += repr([(p, type(m).__qualname__) for p, m in module.named_modules()])
    parts = [
        FORMAT,
        cf.label,
        fn.__module__,
        fn.__qualname__,
        function_digest(fn),
        owner_name,
        repr((opts.backend, opts.mode, opts.fullgraph, opts.dynamic, config)),
        source_digest(),
        torch.__version__,
        sys.version,
    ]
    return "capture-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()


# -- saving -----------------------------------------------------------------------------------


class Saver:
    """Collects one trace's entry as data while frontend.py installs it; `reason` is set
    (and nothing is written) as soon as some part of it cannot be kept."""

    def __init__(self, cf: Any, tracer: Any) -> None:
        self.cf = cf
        self.tracer = tracer
        self.reason: str | None = None
        self.data: dict[str, Any] = {}
        self.enc: Encoder | None = None
        self.key = ""
        try:
            self.key = frame_key(cf)
            self.enc = Encoder(cf.root_callable)
            self.enc.functions = [
                f for f in tracer.inlined.values() if id(f) not in tracer.inner_functions
            ]
            self._check_trace()
        except Exception as e:  # noqa: BLE001 - keeping a capture never fails a compile
            self.refuse(_why(e))

    def refuse(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def _check_trace(self) -> None:
        t = self.tracer
        if t.process_specific is not None:
            raise Uncacheable(t.process_specific)
        if t.dyn is not None:
            raise Uncacheable("it has dynamic shapes")
        if t.np_traced:
            raise Uncacheable("it traces NumPy values")
        if t.context_vars.vars:
            raise Uncacheable("it uses context variables")
        if self.cf.nested:
            raise Uncacheable("it compiles modules apart (data parallel)")
        if any(not isinstance(v, torch.Tensor) for _, v, _ in t.placeholders):
            raise Uncacheable("a graph input is a Python number")

    def refuse_if(self, condition: bool, reason: str) -> None:
        if condition:
            self.refuse(reason)

    def effects(self) -> None:
        """The stores into outside objects' attributes, of plain values, through source paths
        (a library's flag set back after the call): replayed as the entry replays them. Any
        other side effect (a container changed, a global or cell stored, a print) is not."""
        if self.reason is not None:
            return
        assert self.enc is not None
        kept = []
        for eff in self.tracer.side_effects.effects:
            if eff.kind != "attr" or eff.source is None:
                self.refuse(f"it has side effects to replay ({eff.kind})")
                return
            try:
                src = _source(eff.source, self.enc)
            except Exception as e:  # noqa: BLE001
                self.refuse(f"a side effect's target: {_why(e)}")
                return
            value = getattr(eff.target, eff.name, _ABSENT)
            if value is _ABSENT:
                kept.append(("del", src, eff.name, None))
            elif value is None or type(value) in (bool, int, str) or _finite_float(value):
                kept.append(("set", src, eff.name, value))
            else:
                self.refuse(f"a side effect stores a {type(value).__name__}")
                return
        self.data["effects"] = kept

    def result(self, tail: Any, namespace: dict, expr: str, lets: list[str]) -> None:
        """The return value's rebuild code (`lets`: the objects it builds first) and the
        objects it names (taken before the input fetches and guards add theirs)."""
        if tail is not None:
            self.refuse("it has a graph break")
        if self.reason is not None:
            return
        assert self.enc is not None
        try:
            names = [(k, self.enc.value(v)) for k, v in namespace.items()]
            self.data["result"] = (expr, names, list(lets))
        except Exception as e:  # noqa: BLE001
            self.refuse(f"its return value: {_why(e)}")

    def graph(self, graph: Any, constants: dict) -> None:
        """The graph as capture recorded it (before the backend rewrites anything)."""
        if self.reason is not None:
            return
        try:
            self.data["graph"] = graph_data.dump(graph, constants, self.enc)
        except Exception as e:  # noqa: BLE001
            self.refuse(f"its graph: {_why(e)}")

    def finish(self, guards: list[Guard], info: Any, store: Any) -> None:
        """Write the entry (`info`: the graph's CaptureInfo, None without a graph)."""
        payload = b""
        if self.reason is None:
            try:
                self._finish(guards, info)
                payload = pickle.dumps(self.data, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as e:  # noqa: BLE001
                self.refuse(_why(e))
        if self.reason is not None:
            STATS["not_cached"] += 1
            say(f"{self.cf.label}: not kept for other processes: {self.reason}")
            return
        if store.put(self.key, payload):
            STATS["stored"] += 1
            say(f"{self.cf.label}: capture kept ({len(payload)} bytes)")

    def _finish(self, guards: list[Guard], info: Any) -> None:
        enc, t = self.enc, self.tracer
        assert enc is not None
        kept = []
        for g in guards:
            try:
                kept.append(_guard(g, enc))
            except Uncacheable as e:
                raise Uncacheable(f"guard {g.describe()[:120]}: {e}") from None
        self.data["guards"] = kept
        self.data["inputs"] = [_source(src, enc) for src, _, _ in t.placeholders]
        inlined = []
        for fn in t.inlined.values():
            if id(fn) in t.inner_functions:  # made by the trace: its maker's code covers it
                continue
            i = enc.obj(fn)
            if enc.objects[i][0] != "ref":
                raise Uncacheable(f"it ran {fn.__qualname__}, which has no importable name")
            inlined.append(i)
        self.data["inlined"] = inlined
        if info is not None:
            self.data["info"] = (info.static_inputs, info.checked_inputs, info.fixed_call_key)
        else:
            self.data.pop("graph", None)
        self.data["objects"] = enc.objects
        self.data["packages"] = package_versions(enc.objects)
        self.data["format"] = FORMAT


_ABSENT = object()


def _why(e: Exception) -> str:
    return str(e) if isinstance(e, Uncacheable) else f"{type(e).__name__}: {e}"


def _finite_float(value: Any) -> bool:
    return type(value) is float and value - value == 0


def package_versions(objects: list[tuple]) -> dict[str, str]:
    """The `__version__` of each top-level package the entry names objects of (a library's
    functions the trace ran natively, not inline, are covered by its version)."""
    out = {}
    for r in objects:
        if r[0] in ("ref", "module", "globals"):
            top = r[1].split(".")[0]
            version = getattr(sys.modules.get(top), "__version__", None)
            if isinstance(version, str):
                out[top] = version
    return out


def _guard(g: Guard, enc: Encoder) -> tuple:
    if g.kind == "TREE":
        return ("TREE",)
    if g.source is None and g.kind not in ("STATE",):
        raise Uncacheable(f"a {g.kind} guard has no source path")
    held = {k: enc.value(v) for k, v in g.held.items()}
    src = _source(g.source, enc) if g.source is not None else None
    other = _source(g.other, enc) if g.other is not None else None
    try:
        text = g.text
    except Exception:  # noqa: BLE001 - a description that cannot be written: keep none
        text = g.kind
    return (g.kind, src, g.check, held, text, other, g.native)


def _source(src: Source, enc: Encoder) -> tuple:
    t = type(src)
    if t is LocalSource:
        return ("L", src.name)
    if t is ConstSource:
        return ("C", enc.obj(src.obj), src.label)
    if t is GlobalSource:
        return ("G", enc.obj(src.globals_dict), src.name, src.is_root)
    if t is CellSource:
        return ("cell", enc.obj(src.cell), src.name)
    if t is AttrSource:
        return ("A", _source(src.base, enc), src.name)
    if t is InstanceDictSource:
        return ("D", _source(src.base, enc), src.name)
    if t is ItemSource:
        raw = enc.value(src.raw) if src.raw is not None else None
        return ("I", _source(src.base, enc), enc.value(src.key), src.key_label, raw)
    if t is WeakRefSource:
        return ("W", _source(src.base, enc))
    raise Uncacheable(f"a guard reads {src.describe()}, which has no source path")


# -- loading ----------------------------------------------------------------------------------


class Loaded:
    """An entry found again: guards, graph input sources, result code and names, the graph."""

    def __init__(self, data: dict, res: Resolver) -> None:
        self.guards = [_unguard(g, res) for g in data["guards"]]
        self.inputs = [_unsource(s, res) for s in data["inputs"]]
        expr, names, lets = data["result"]
        self.result_expr = expr
        self.lets = lets
        self.effects = [(op, _unsource(s, res), name, v) for op, s, name, v in data["effects"]]
        self.result_names = [(k, res.value(v)) for k, v in names]
        self.graph = data.get("graph")
        self.info = data.get("info")
        self.modules = [o for o in res.objects if isinstance(o, torch.nn.Module)]
        self.resolver = res


def load(cf: Any, store: Any) -> Loaded | None:
    """The kept entry of `cf`'s frame, its objects found in this process; None (saying why)
    when there is none or it cannot be used."""
    try:
        key = frame_key(cf)
        raw = store.get(key)
    except Exception as e:  # noqa: BLE001 - nothing to look up: capture as usual
        say(f"{cf.label}: no capture cache: {_why(e)}")
        return None
    if raw is None:
        STATS["misses"] += 1
        say(f"{cf.label}: no kept capture")
        return None
    try:
        data = pickle.loads(raw)
        if data.get("format") != FORMAT:
            raise Uncacheable(f"entry format {data.get('format')!r}")
        now = package_versions(data["objects"])
        changed = [p for p, v in data["packages"].items() if now.get(p) != v]
        if changed:  # a library's own functions, run natively, are not checked one by one
            raise Uncacheable(f"package {changed[0]} is another version now")
        res = Resolver(cf.root_callable, data["objects"])
        for i in data["inlined"]:
            resolve_named(data["objects"][i])  # (a function's code changed: refused)
        loaded = Loaded(data, res)
    except Uncacheable as e:
        STATS["misses"] += 1
        say(f"{cf.label}: kept capture not used: {e}")
        return None
    except Exception as e:  # noqa: BLE001 - a damaged or foreign entry: capture as usual
        STATS["misses"] += 1
        say(f"{cf.label}: kept capture not used: {type(e).__name__}: {e}")
        return None
    return loaded


def _unguard(d: tuple, res: Resolver) -> Guard | None:
    if d[0] == "TREE":
        return None  # made anew for this process (frontend.py)
    kind, src, check, held, text, other, native = d
    return Guard(
        _unsource(src, res) if src is not None else None,
        kind,
        check,
        {k: res.value(v) for k, v in held.items()},
        text,
        _unsource(other, res) if other is not None else None,
        native,
    )


def _unsource(d: tuple, res: Resolver) -> Source:
    tag = d[0]
    if tag == "L":
        return LocalSource(d[1])
    if tag == "C":
        return ConstSource(res.objects[d[1]], d[2])
    if tag == "G":
        return GlobalSource(res.objects[d[1]], d[2], d[3])
    if tag == "cell":
        return CellSource(res.objects[d[1]], d[2])
    if tag == "A":
        return AttrSource(_unsource(d[1], res), d[2])
    if tag == "D":
        base = _unsource(d[1], res)
        assert isinstance(base, ConstSource)
        return InstanceDictSource(base, d[2])
    if tag == "I":
        raw = res.value(d[4]) if d[4] is not None else None
        return ItemSource(_unsource(d[1], res), res.value(d[2]), d[3], raw)
    if tag == "W":
        return WeakRefSource(_unsource(d[1], res))
    raise Uncacheable(f"unknown source {tag!r}")


def tree_guard() -> Guard:
    """The module-structure guard of an entry loaded in this process (attributes.py makes the
    same one in a trace): the structure of the watched modules found by their paths now."""
    return Guard(
        None,
        "TREE",
        "{v}[0] == " + str(module_tree.VERSION[0]),
        {"v": module_tree.VERSION},
        "nn.Module structure unchanged",
    )


class BindFailed(Exception):
    """The kept graph could not be handed to the backend: the call is captured instead."""


class Binder:
    """The `___graph` of a loaded entry until its first call (after the guards held): makes the
    graph module, hands it to the backend with this call's inputs (the compiled-artifact cache
    then loads the compiled graph), puts what the backend gave in the entry, and runs it."""

    def __init__(self, cf: Any, loaded: Loaded) -> None:
        self.cf = cf
        self.loaded = loaded
        self.scope: dict | None = None

    def __call__(self, *inputs):
        cf, loaded = self.cf, self.loaded
        try:
            gm = graph_data.load(loaded.graph, loaded.resolver)
            static, checked, fixed = loaded.info
            info = CaptureInfo(
                label=cf.label,
                options=cf.opts,
                static_inputs=tuple(static),
                checked_inputs=tuple(checked),
                fixed_call_key=fixed,
            )
            compiled = cf.backend(gm, list(inputs), info)
            if not callable(compiled):
                raise TypeError(f"the backend gave {type(compiled).__name__}")
        except Exception as e:  # noqa: BLE001 - any failure: the call is captured as usual
            raise BindFailed(f"{type(e).__name__}: {e}") from e
        cf.compiles += 1
        cf.graph_modules.append(gm)
        if self.scope is not None:
            self.scope["___graph"] = compiled
        return compiled(*inputs)
