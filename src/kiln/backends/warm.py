"""The warm start: compiled graphs kept on disk, so that a new process redoes only capture.

Takes a captured graph with its `CaptureInfo`, and from AOT autograd (`aot_compile(...,
entry_store=...)`, autograd/compile.py) each call signature's entry as it is compiled; gives
`entry_store(info)`, the `EntryStore` the `inductor` backend hands AOT autograd. It keeps an
entry as data in the compiled-artifact store (runtime/artifacts.py) and, in a later process,
gives it back without AOT tracing, partitioning, lowering, scheduling or rendering: what AOT
autograd found about the graph (`GraphMeta`, the training plan) and, per ATen graph, the build
as data (`devices.Loadable`: sources, kernel names, op names, constants), whose load takes the
kernels from the builders' content-keyed caches (no compiler runs).

The key of an entry is a SHA-256 of everything the compiled entry depends on:

* the graph as capture gave it (before AOT autograd's rewrites, which a loaded entry skips):
  its nodes as data (op, name, arguments; not FX's generated code, which a warm start would
  otherwise generate only for this), each call target's identity (an ATen op or a torch
  function by name; any other Python function by a digest of its compiled code that is the
  same in every process, pycode.py, and its plain defaults and closure values), the values of
  its attributes (constant tensors by content, nested graphs by their own key) and the node
  marks AOT autograd reads (`recompute`);
* its inputs as capture described them (types, sizes and strides with symbolic dimensions by
  name, so a graph with dynamic sizes never matches a static one) and the call's inputs as AOT
  autograd receives them (sizes, strides, offsets, dtypes, devices, requires_grad, leaves,
  views, which inputs share storage), with AOT autograd's own entry key (grad mode, each
  input's requires_grad, plain values);
* the options that reach compilation, the positions capture checks, the partition strategy;
* the code and the machine: kiln's source digest (version.py), torch, Python, the C++ compiler
  and CPU, Triton and the GPU for CUDA graphs, and global torch state compilation reads
  (default dtype, autocast, deterministic algorithms, matmul precision and TF32 flags).

A graph with symbolic sizes (dynamic) is keyed by its inputs' symbolic sizes (`s0`, not the
call's 8), so one entry serves every size in every process. Its entry keeps, as Python source
over the call's inputs (`a[0].size(0)`), every guard of its trace's shape environment (capture's
and AOT tracing's: a later process's capture, having seen other sizes first, may have guarded
other facts) and the functions that compute outputs' symbolic sizes; a call that fails the
guards gets an entry traced for its own sizes, as in the process that compiled it. An entry
whose trace fell back to the call's sizes is not kept under the symbolic key.

What is not kept (it compiles as before, every process): a graph whose call targets or
attributes cannot be named soundly (a callable object, a closure over a tensor), an entry any
of whose graphs fell back to eager kernels (the fallback is recorded again each time), graphs
for device graphs (reduce-overhead), devices without `CodeGen.loadable`, and anything that does
not pickle. While detailed logs (`aot_graphs`, `output_code`, `passes`, `schedule`,
`perf_hints`) or the trace are on, entries are compiled (and kept) rather than loaded, so that
what they show is there. `KILN_ARTIFACT_CACHE=0` switches the cache off.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import io
import pickle
import sys
import types
import warnings
from typing import Any, Callable

import torch

from .. import logs, options, pycode, trace
from ..autograd.analyze import GraphMeta
from ..autograd.compile import GuardedEntry
from ..autograd.runtime import InferenceEntry, SymbolicOutputs, TrainingEntry, TrainingPlan
from ..autograd.symbolic import compile_function
from ..autograd.zero_tangents import KeptZeroTangents, ZeroTangents
from ..contracts import CaptureInfo
from ..devices import Loadable
from ..pycode import code_digest
from ..runtime.artifacts import open_store
from ..version import source_digest

FORMAT = 2
# logs that show compile products: while one is on, entries are compiled, not loaded
_DETAIL_LOGS = ("aot_graphs", "output_code", "passes", "schedule", "perf_hints")
# options that do not change what is compiled
_NOT_COMPILED = ("trace.enabled", "trace.dir", "warn_eager", "cache_size_limit")
_PLAIN = (int, float, bool, str, bytes, type(None))
_DESCRIPTORS = (
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.ClassMethodDescriptorType,
)


# this process's loads, compiles with a miss, and entries written (tests and benchmarks read it)
STATS = {"hits": 0, "misses": 0, "stored": 0, "not_cached": 0}


class Unkeyable(Exception):
    """Something the entry depends on that the key cannot name soundly: not cached."""


def entry_store(info: CaptureInfo, checked: list[int]) -> WarmStore | None:
    """The store for the graph `info` describes, or None when the cache is off."""
    if not options.env_artifact_cache():
        return None
    return WarmStore(info, checked)


class WarmStore:
    """An `EntryStore` (autograd/compile.py) over the compiled-artifact store."""

    def __init__(self, info: CaptureInfo, checked: list[int]) -> None:
        self.info = info
        self.checked = checked
        self.graph_key: str | None = None  # the captured graph's part of the key, once
        self.keys: dict[tuple, str | None] = {}

    def key(self, compiled: Any, args: list, entry_key: tuple) -> str | None:
        if entry_key in self.keys:
            return self.keys[entry_key]
        if self.graph_key is None and compiled.rewritten:
            # the graph is keyed as captured, before AOT autograd's rewrites (which a loaded
            # entry skips, autograd/compile.py `_rewrite`): its rewritten form has no key
            self.keys[entry_key] = None
            return None
        try:
            if self.graph_key is None:
                self.graph_key = graph_key(compiled.gm)
            key = hashlib.sha256(
                "\0".join(
                    [
                        self.graph_key,
                        _config(self.info, self.checked, compiled),
                        repr(entry_key),
                        _args(args, compiled.world.examples if compiled.world else None),
                        _environment(args, self.info.options.get("codegen.device")),
                    ]
                ).encode()
            ).hexdigest()
        except Unkeyable as e:
            logs.log("perf_hints", f"warm start: {self.info.label} is not cached: {e}")
            STATS["not_cached"] += 1
            key = None
        self.keys[entry_key] = key
        return key

    def load(self, compiled: Any, args: list, entry_key: tuple) -> Any:
        key = self.key(compiled, args, entry_key)  # (first: on the graph as captured)
        if trace.recording() or any(logs.is_on(a) for a in _DETAIL_LOGS):
            return None
        store = open_store() if key is not None else None
        if key is None or store is None:
            return None
        data = store.get(key)
        if data is None:
            STATS["misses"] += 1
            return None
        try:
            entry = unpack(data, compiled, entry_key, _variants(store, key))
        except Exception as e:  # an entry of other code that slipped past the key: compile
            logs.warn(f"kiln cache: cannot load compiled graph {key[:16]} ({e!r}); compiling it")
            STATS["misses"] += 1
            return None
        STATS["hits"] += 1
        trace.event("cache", kind="aot", key=key, result="disk")
        return entry

    def save(self, compiled: Any, args: list, entry_key: tuple, entry: Any) -> None:
        key = self.key(compiled, args, entry_key)
        if key is None:
            return
        try:
            data = pack(entry, _shape_guards(compiled))
        except Unkeyable as e:
            logs.log("perf_hints", f"warm start: {self.info.label} is not cached: {e}")
            STATS["not_cached"] += 1
            return
        store = open_store()
        if store is not None and store.put(key, data):
            STATS["stored"] += 1
            inner = entry.entry if isinstance(entry, GuardedEntry) else entry
            zeros = getattr(getattr(inner, "plan", None), "zero_tangents", None)
            if isinstance(zeros, ZeroTangents):  # its variants, as the backward compiles them
                zeros.on_compiled = functools.partial(_save_variant, store, key)


# -- backwards for absent tangents (autograd/zero_tangents.py) ---------------------------------
# An HF model's logits get no gradient when the loss alone is backpropagated; without the
# variant compiled for that, a loaded entry's backward would read zeros of the logits' size,
# allocated when the most memory is alive. Each variant is kept under its own key as it is
# compiled (the first backward), and loaded by a later process's first such backward.


def _variant_key(key: str, absent: tuple[int, ...]) -> str:
    return hashlib.sha256(f"{key}\0zero_tangents\0{absent!r}".encode()).hexdigest()


def _save_variant(store: Any, key: str, absent: tuple[int, ...], compiled: Any) -> None:
    try:
        data = pickle.dumps({"format": FORMAT, "graph": _graph(compiled)})
    except Unkeyable:  # it runs on eager kernels: compiled again by the next process
        return
    store.put(_variant_key(key, absent), data)


def _variants(store: Any, key: str) -> Callable[[tuple[int, ...]], Any]:
    """The loader of a loaded entry's kept variants (KeptZeroTangents.load)."""

    def load(absent: tuple[int, ...]) -> Any:
        data = store.get(_variant_key(key, absent))
        if data is None:
            return None
        try:
            body = pickle.loads(data)
            return _load(body["graph"]) if body.get("format") == FORMAT else None
        except Exception as e:  # other code's: the whole backward with zeros serves
            logs.warn(f"kiln cache: cannot load a backward variant of {key[:16]} ({e!r})")
            return None

    return load


# -- the key ----------------------------------------------------------------------------------


def graph_key(gm: torch.fx.GraphModule) -> str:
    """A digest of a captured graph: its nodes (op, name, target, arguments), its call targets
    and attributes, node marks and its inputs as capture described them (see the module doc)."""
    # each node as data, not the graph's Python code: FX's code generation cost a tenth of a
    # GPT-2 warm start's first call, and a graph capture left lazy (lazy_graphs.py) is never
    # generated on a warm start at all
    parts = []
    for node in gm.graph.nodes:
        args = _arg_text((node.args, node.kwargs))
        parts.append(f"{node.op} {node.name} {node.target if node.op != 'call_function' else ''}")
        parts.append(args)
        if node.op in ("call_function", "call_method"):
            parts.append(f"{node.name}={_target(node.target)}")
        elif node.op == "get_attr":
            parts.append(f"{node.name}={_attribute(gm, node.target)}")
        elif node.op == "placeholder":
            parts.append(
                f"{node.name}:{_value(node.meta.get('example_value', node.meta.get('val')))}"
            )
        elif node.op == "call_module":
            raise Unkeyable(f"the graph calls a module ({node.target})")
        for mark in ("recompute", "ac_graph_id", "kiln_layout_guarded"):
            if mark in node.meta:
                parts.append(f"{node.name}.{mark}={node.meta[mark]!r}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


# argument values named by their repr (which, for these, spells the value and nothing else)
_REPR_ARGS = (torch.dtype, torch.device, torch.layout, torch.memory_format, type(...))


def _arg_text(a: Any) -> str:
    """A node's argument as text that names it in every process: nodes by name, containers by
    their items, plain values and torch's enum-like values by repr; anything else is not a
    value the key can name soundly."""
    if isinstance(a, torch.fx.Node):
        return f"%{a.name}"
    if isinstance(a, (tuple, list)):  # (FX's immutable_list; torch.Size)
        return f"{type(a).__name__}(" + ",".join(_arg_text(x) for x in a) + ")"
    if isinstance(a, dict):
        return "{" + ",".join(f"{k!r}:{_arg_text(v)}" for k, v in a.items()) + "}"
    if type(a) is slice:
        return f"slice({_arg_text(a.start)},{_arg_text(a.stop)},{_arg_text(a.step)})"
    if isinstance(a, (*_PLAIN, complex)) or isinstance(a, _REPR_ARGS):
        return f"{type(a).__name__}:{a!r}"
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"sym:{type(a).__name__}:{a}"
    try:
        return f"target:{_target(a)}"  # a function or op passed as an argument
    except Unkeyable:
        raise Unkeyable(f"an argument is a {type(a).__name__}") from None


def _target(target: Any) -> str:
    if isinstance(target, str):  # a method name
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"op:{target}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"hop:{target.name()}"
    if isinstance(target, types.BuiltinFunctionType):
        owner = target.__self__
        if owner is not None and not isinstance(owner, (types.ModuleType, type)):
            raise Unkeyable(f"call target {target!r} is bound to an object")
        return f"builtin:{target.__module__}.{target.__qualname__}:{getattr(owner, '__name__', '')}"
    if isinstance(target, _DESCRIPTORS):  # torch.Tensor.add and the like
        return f"method:{target.__objclass__.__module__}.{target.__qualname__}"
    if isinstance(target, type) and target.__module__.split(".")[0] in ("builtins", "torch"):
        return f"type:{target.__module__}.{target.__qualname__}"
    if isinstance(target, types.MethodType) and isinstance(target.__self__, type):
        cls = target.__self__  # a classmethod (autograd.Function.apply): the class's code too
        funcs = [
            f
            for c in cls.__mro__
            if c.__module__ not in ("torch.autograd.function", "torch._C", "builtins")
            for f in vars(c).values()
        ]
        return f"class:{cls.__module__}.{cls.__qualname__}:" + ",".join(
            _function(getattr(f, "__func__", f)) for f in funcs if _is_function(f)
        )
    if isinstance(target, types.FunctionType):
        return _function(target)
    raise Unkeyable(f"call target {target!r} is not a function kiln can name")


def _is_function(f: Any) -> bool:
    return isinstance(getattr(f, "__func__", f), types.FunctionType)


def _function(fn: types.FunctionType) -> str:
    """A Python function by its module and name; one outside torch also by its compiled code,
    plain defaults and closure values (torch's own are fixed by torch's version)."""
    name = f"{fn.__module__}.{fn.__qualname__}"
    if (fn.__module__ or "").split(".")[0] == "torch":
        return f"fn:{name}"
    cells = [c.cell_contents for c in fn.__closure__ or ()]
    plain = [fn.__defaults__ or (), sorted((fn.__kwdefaults__ or {}).items()), cells]
    if not _is_plain(plain):
        raise Unkeyable(f"{name} has defaults or closure values that are not plain values")
    # (not marshal's bytes: they differ between processes, pycode.py)
    return f"fn:{name}:{code_digest(fn.__code__)}:{plain!r}"


def _is_plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    return isinstance(value, _PLAIN)


def _attribute(gm: torch.fx.GraphModule, target: str) -> str:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    if isinstance(value, torch.fx.GraphModule):
        return f"graph:{graph_key(value)}"
    if isinstance(value, torch.Tensor):
        if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided:
            raise Unkeyable(f"attribute {target} is a {type(value).__name__}")
        data = value.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
        return f"tensor:{_value(value)}:{hashlib.sha256(data).hexdigest()}"
    if _is_plain(value):
        return repr(value)
    raise Unkeyable(f"attribute {target} is a {type(value).__name__}")


def _value(v: Any, geometry: Any = None) -> str:
    """What compilation may read of one value: a tensor's metadata (symbolic dims by name);
    its sizes, strides and offset those of `geometry` when given (capture's fake of it, in a
    graph with symbolic sizes)."""
    if isinstance(v, torch.Tensor):
        g = v if geometry is None else geometry
        return (
            f"{type(v).__name__}({tuple(map(str, g.shape))},{tuple(map(str, g.stride()))},"
            f"{g.storage_offset()},{v.dtype},{v.device},{v.layout},rg={v.requires_grad},"
            f"leaf={v.is_leaf},view={v._base is not None},inf={_inference(v)})"
        )
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"sym:{type(v).__name__}:{v}"
    if _is_plain(v):
        return f"{type(v).__name__}:{v!r}"
    return f"type:{type(v).__module__}.{type(v).__qualname__}"


def _inference(t: torch.Tensor) -> bool:
    try:
        return t.is_inference()
    except Exception:  # a fake tensor of some torch versions
        return False


def _args(args: list, examples: list | None = None) -> str:
    """The call's inputs: each one's metadata and which ones share storage. `examples`:
    capture's fakes of them when the graph has symbolic sizes: a tensor's geometry is then its
    fake's (symbols by name), which every call the entry serves shares."""
    parts: list[str] = []
    storages: dict[tuple, int] = {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if a.layout != torch.strided or type(a) not in (torch.Tensor, torch.nn.Parameter):
                raise Unkeyable(f"an input is a {type(a).__name__} ({a.layout})")
            ptr = a.untyped_storage().data_ptr()
            group = storages.setdefault((a.device, ptr), len(storages)) if ptr else -1
            ev = examples[i] if examples is not None and i < len(examples) else None
            geometry = ev if isinstance(ev, torch.Tensor) and ev.dim() == a.dim() else None
            parts.append(f"{_value(a, geometry)}@{group},conj={a.is_conj()},neg={a.is_neg()}")
        else:
            parts.append(_value(a))
    return ";".join(parts)


def _config(info: CaptureInfo, checked: list[int], compiled: Any) -> str:
    opts = info.options
    values = sorted(
        (name, repr(opts.get(name))) for name in options.KNOWN_OPTIONS if name not in _NOT_COMPILED
    )
    return repr(
        (
            FORMAT,
            opts.mode,
            opts.dynamic,
            values,
            checked,
            info.fixed_call_key,
            compiled.partition,
            compiled.float_inputs,
        )
    )


def _environment(args: list, device: str | None) -> str:
    """The code, the machine and the global torch state compilation reads."""
    from ..native.compiler import CompilerNotFound, find_compiler
    from ..runtime.cpp_builder import _machine

    try:
        compiler = find_compiler()
    except CompilerNotFound:
        compiler = None
    parts: list[Any] = [
        source_digest(),
        torch.__version__,
        sys.version,
        _machine(),
        compiler,
        torch.get_default_dtype(),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_float32_matmul_precision(),
        [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")],
    ]
    cuda = [a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"]
    if cuda or device is not None:  # Triton compiles (or interprets) it
        from ..runtime.triton_interpret import is_interpreting

        parts += [device, _package_version("triton"), is_interpreting()]
    if cuda:
        parts += [
            torch.version.cuda,
            torch.cuda.get_device_name(cuda[0]),
            torch.cuda.get_device_capability(cuda[0]),
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cuda.flash_sdp_enabled(),
            torch.backends.cuda.mem_efficient_sdp_enabled(),
            torch.backends.cuda.math_sdp_enabled(),
        ]
    return repr(parts)


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# -- an entry as data -------------------------------------------------------------------------


def _shape_guards(compiled: Any) -> dict | None:
    """A symbolic entry's check in a later process: every guard of the shape environment, as
    Python over the call's inputs. In the compiling process capture checks the guards it made
    and the entry those AOT tracing added; a later process's capture may have made other ones
    (it saw other sizes first), which need not imply what this trace was allowed to assume."""
    world, reader = compiled.world, compiled.reader
    if world is None or reader is None:
        return None
    from ..autograd.sizes import guards_since

    env = world.shape_env
    guards = guards_since(env, 0) if env is not None else []
    unreadable = [g for g in guards if not reader.can_read(g)]
    if unreadable:
        raise Unkeyable(f"its shape guard {unreadable[0]} reads no input's size")
    check = reader.check(guards)
    return {"source": check.source, "text": " and ".join(reader.render(g) for g in guards)}


def pack(entry: Any, shape_guards: dict | None = None) -> bytes:
    """An entry as bytes; `Unkeyable` when a graph of it is not a kiln-compiled graph with a
    `loadable` (it fell back to eager kernels, or runs as a device graph), or when anything
    of it is a live symbolic value (which would not mean the same in another process).
    `shape_guards`: a symbolic entry's guards (`_shape_guards`), checked on each call."""
    if isinstance(entry, GuardedEntry):  # (its guards are among `shape_guards`)
        entry = entry.entry
    if isinstance(entry, TrainingEntry):
        plan = entry.plan
        fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
        fields["fw"], fields["bw"] = _graph(plan.fw), _graph(plan.bw)
        zeros = plan.zero_tangents  # graphs and a compiler: kept as the tangents' specs
        fields["zero_tangents"] = zeros.specs() if isinstance(zeros, ZeroTangents) else None
        body: dict[str, Any] = {"kind": "training", "plan": fields}
    elif isinstance(entry, InferenceEntry):
        body = {"kind": "inference", "forward": _graph(entry.forward)}
    else:
        raise Unkeyable(f"an entry of type {type(entry).__name__}")
    body.update(meta=_meta(entry.meta), tensor_only=entry.tensor_only, format=FORMAT)
    sym = entry.symbolic
    body["symbolic"] = None if sym is None else {"spans": sym.spans, "source": sym.read.source}
    body["shape_guards"] = shape_guards
    out = io.BytesIO()
    try:
        _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(body)
    except Unkeyable:
        raise
    except Exception as e:
        raise Unkeyable(f"it does not pickle ({type(e).__name__}: {e})") from None
    return out.getvalue()


class _Pickler(pickle.Pickler):
    """Refuses symbolic values and fake tensors: they belong to this process's trace."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (torch.SymInt, torch.SymFloat, torch.SymBool, torch.fx.Node)):
            raise Unkeyable(f"it holds a {type(obj).__name__} ({obj})")
        if isinstance(obj, torch.Tensor) and type(obj) not in (torch.Tensor, torch.nn.Parameter):
            raise Unkeyable(f"it holds a {type(obj).__name__}")
        return NotImplemented


def _graph(compiled: Any) -> dict:
    made = getattr(compiled, "loadable", None)
    if not isinstance(made, Loadable):
        raise Unkeyable("a graph of it runs on eager kernels or as a device graph")
    from ..codegen.compiled import WRAPPER_FILE

    data = dict(made.data)
    if isinstance(data.get("wrapper"), str):  # its code too: a later process need not compile it
        data["wrapper_code"] = pycode.dump(compile(data["wrapper"], WRAPPER_FILE, "exec"))
    return {
        "loader": made.loader,
        "data": data,
        "kernel_source": compiled.kernel_source,
        "wrapper_source": compiled.wrapper_source,
        "device": compiled.device,
        "kernel_language": compiled.kernel_language,
        "kernel_count": compiled.kernel_count,
    }


def _meta(meta: GraphMeta) -> GraphMeta:
    """`meta` as the runtime reads it: graph nodes (the bases of aliased outputs) named by
    their names (the runtime only matches them with each other); what the runtime does not
    read left out: the geometry of outputs returned as they are, the symbolic values of
    outputs computed per call (`GraphMeta.symbolic`, by `SymbolicOutputs`) and the traced
    values' shapes (read by tracing only)."""
    outputs = []
    for j, o in enumerate(meta.outputs):
        o = dataclasses.replace(o, base=o.base.name if o.base is not None else None)  # type: ignore[arg-type]
        if j in meta.symbolic:  # computed per call
            o = dataclasses.replace(o, size=(), stride=(), offset=0, value=None)
        elif o.kind in ("fresh", "dup", "input"):  # returned as they are: geometry unread
            o = dataclasses.replace(o, size=(), stride=(), offset=0)
        outputs.append(o)
    bases: list[Any] = [b.name for b in meta.bases]
    return dataclasses.replace(meta, outputs=outputs, bases=bases, value_specs=[])


def unpack(data: bytes, owner: Any = None, key: tuple = (), variants: Any = None) -> Any:
    """The entry `data` holds; `owner` (the `AotCompiled`) and `key` (its entry key) serve a
    symbolic entry's calls that fail its shape guards; `variants(absent)` loads a backward
    kept for absent tangents (`_variants`), or gives None."""
    with warnings.catch_warnings():  # torch's pytree warns on unpickling its LeafSpec
        warnings.simplefilter("ignore", FutureWarning)
        body = pickle.loads(data)
    if body.get("format") != FORMAT:
        raise ValueError(f"entry format {body.get('format')!r}")
    meta = body["meta"]
    sym = body["symbolic"]
    outputs = None
    if sym is not None:
        outputs = SymbolicOutputs(sym["spans"], compile_function(sym["source"], "symbolic_outputs"))
    entry: Any
    if body["kind"] == "inference":
        entry = InferenceEntry(meta, _load(body["forward"]), body["tensor_only"], outputs)
    else:
        fields = dict(body["plan"])
        fields["fw"], fields["bw"] = _load(fields["fw"]), _load(fields["bw"])
        if fields["zero_tangents"] is not None:
            fields["zero_tangents"] = KeptZeroTangents(
                fields["zero_tangents"], fields["bw"], variants or (lambda absent: None)
            )
        entry = TrainingEntry(meta, TrainingPlan(**fields), body["tensor_only"], outputs)
    guards = body["shape_guards"]
    if guards is not None:
        if owner is None:
            raise ValueError("a symbolic entry needs the compiled graph it belongs to")
        check = compile_function(guards["source"], "shape_guards")
        entry = GuardedEntry(entry, check, guards["text"], owner, key)
    return entry


def _load(graph: dict) -> Any:
    from ..codegen.compiled import CompiledGraph

    if not graph["loader"].startswith("kiln."):
        raise ValueError(f"loader {graph['loader']!r} is not kiln's")
    made = Loadable(graph["loader"], graph["data"])
    return CompiledGraph(
        made.load(),
        None,
        graph["kernel_source"],
        graph["wrapper_source"],
        0.0,
        graph["device"],
        graph["kernel_language"],
        made,
        graph["kernel_count"],
    )
