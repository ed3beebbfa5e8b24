"""The recording side of a trace: an FX graph of torch-level calls over real tensors.

Takes the torch calls a traced frame makes (every one, through a TorchFunctionMode, whether the
interpreter or native code made it) and the values the interpreter reads from outside the frame;
gives the FX graph, its placeholders (each with the source it is fetched from), the guards, and
the side-effect log. Each torch call runs for real, so every value is eager's exactly; the mode
only adds a node per call. A call the graph cannot hold (a Python value read off tensor data,
say) is a graph break: the trace goes on concretely, so the call still finishes correctly.
"""

from __future__ import annotations

import contextvars
import functools
import operator
import re
import types
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.overrides import TorchFunctionMode

from . import containers, data_sizes, leaf_tensors, numpy_values
from . import guards as G
from .context_vars import ContextVarModel
from .dynamic_floats import FloatSlots
from .dynamic_metadata import symbolic_metadata
from .errors import FullgraphBreak, SubgraphBreak
from .side_effects import SideEffects
from .sources import AttrSource, ConstSource, ItemSource, Source
from .symbolic import _Sym
from .symbolic import make as make_sym
from .torch_calls import call_info, node_target

_Parameter = torch.nn.Parameter
# `node.args = a` through the properties' setters: what assignment does, without Node's
# __setattr__, which takes the node out of the graph's (op, target) lookup table and puts it
# back around every attribute it sets (neither op nor target changes here)
_set_args = fx.Node.args.fset
_set_kwargs = fx.Node.kwargs.fset
# arguments that stand for themselves in a node (kiln's symbolic numbers are int/float
# subclasses, so `type(a) in` leaves them to `_as_arg`)
_PLAIN_ARGS = frozenset((int, float, bool, str, type(None), torch.dtype, torch.device))


@dataclass
class Break:
    reason: str
    hint: str
    where: str


@functools.lru_cache(maxsize=1)
def _async_wrappers() -> tuple:
    """The op that wraps a functional collective's result in an AsyncCollectiveTensor (waited
    when first used, eagerly); recorded as `wait_tensor`, a plain tensor a kernel can read."""
    ns = getattr(torch.ops, "_c10d_functional", None)
    try:
        op = ns._wrap_tensor_autograd if ns is not None else None
    except AttributeError:  # a torch without it (or before torch.distributed registered it)
        _async_wrappers.cache_clear()
        return ()
    return (op, op.default)


class RecordingMode(TorchFunctionMode):
    def __init__(self, tracer: "Tracer") -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.tracer.on_torch_call(func, args, kwargs or {})


class Tracer:
    def __init__(self, options, location_fn) -> None:
        self.options = options
        self.graph = fx.Graph()
        self.tensor_nodes: dict[int, fx.Node] = {}  # id -> node, while the tensor lives
        self._refs: dict[int, weakref.ref] = {}  # intermediates, watched, not kept alive
        self.keepalive: list[Any] = []
        self.placeholders: list[tuple[Source, torch.Tensor, fx.Node]] = []
        self.sources: dict[int, tuple[Any, Source]] = {}
        self.guards = G.GuardSet()
        self.side_effects = SideEffects()
        self.context_vars = ContextVarModel(self)
        self.float_slots = FloatSlots(self)  # floats in dicts that change between calls
        self.constants: dict[str, torch.Tensor] = {}
        self.broken: Break | None = None
        self.effects_visible = False
        self.location_fn = location_fn
        self.mode = RecordingMode(self)
        self.inner_cells: set[int] = set()
        self.inner_functions: set[int] = set()
        self.inlined: dict[int, Any] = {}  # id -> every Python function run inline (held)
        # why what this trace computed holds in this process only (an `id()`, a string's
        # hash, a set's order): its capture is not kept for other processes (capture_cache)
        self.process_specific: str | None = None
        self.created_objects: set[int] = set()  # user-class instances made during the trace
        self.tree_guarded = False  # the module-structure guard is added once per trace
        self.dict_guarded: set[int] = set()  # held objects whose __dict__ is guarded
        self.attr_reads: dict[tuple[int, str], Any] = {}  # (id(held obj), name) -> value read
        self.hooks_guarded: set[int] = set()  # held modules whose hook dicts are guarded
        self.global_reads: dict[tuple[int, str], tuple] = {}  # (id(g), name) -> (g, value)
        self.global_hooks_guarded = False
        self.interp = None  # set by the frontend; consulted to decide if a break can resume
        # ((module) -> CompiledFunction, settings key), set by the frontend: how a module met in
        # the trace that kiln runs its own way (data_parallel.py) is compiled
        self.compile_module: tuple | None = None
        self.dynamic_policy = None  # (source, tensor) -> dims to make symbolic; set by frontend
        self.dyn = None  # DynamicShapes, created by the first dynamic input
        self._size_nodes: dict[tuple[int, int], fx.Node] = {}
        self.mutated_attrs: set[tuple[int, str]] = set()
        self.mutated_objs: set[int] = set()
        self._names: set[str] = set()
        self._node_names: dict[int, str] = {}
        self._first_op: fx.Node | None = None  # placeholders go before it
        self._examples: list[tuple[fx.Node, tuple | None]] = []  # see example_values
        self._numpy_args = False  # the call being recorded has a NumPy argument
        self.np_traced: dict[int, tuple] = {}  # id -> (array, backing tensor): numpy_trace.py
        self.inference_read = False  # the trace read `is_inference()` (inference_guard)
        self.offset_read = False  # the trace read a `storage_offset()` (offset_guard)
        self.data_sized = data_sizes.DataSized()  # nonzero's, x[mask]'s outputs and their uses
        self.branch_capture = 0  # > 0 while a torch.cond branch is traced (higher_order.py)
        self.grad_enabled = torch.is_grad_enabled()
        self.guards.add(
            G.state_guard("torch.is_grad_enabled()", torch.is_grad_enabled, self.grad_enabled)
        )
        self.autocast = _autocast_state()
        self._autocast_flat = _autocast_flat()
        for dev, state in self.autocast.items():
            self.guards.add(
                G.state_guard(f"autocast state of {dev}", _AUTOCAST_READERS[dev], state)
            )

    # ---- breaks -------------------------------------------------------------------------------
    def graph_break(self, reason: str, hint: str = "", step: tuple | None = None) -> None:
        """End the graph here. `step`, (fn, args, kwargs), is what the plain-Python step after
        the break calls instead of the call being traced (a call kiln runs its own way)."""
        where = self.location_fn()
        if self.options.fullgraph:
            msg = f"graph break under fullgraph=True\n  at {where}\n  reason: {reason}"
            if hint:
                msg += f"\n  hint: {hint}"
            raise FullgraphBreak(msg)
        if self.branch_capture:  # inside a subgraph: the operator breaks before itself
            raise SubgraphBreak(reason, hint, where)
        if self.broken is None and self.interp is not None:
            from .continuations import ResumableBreak, can_resume

            if can_resume(self.interp):
                raise ResumableBreak(reason, hint, where, step)
        if self.broken is None:
            self.broken = Break(reason, hint, where)

    @property
    def recording(self) -> bool:
        return self.broken is None

    # ---- values from outside the frame --------------------------------------------------------
    def track(self, value: Any, source: Source, depth: int = 0) -> None:
        """Register that `value` was read from `source`: guard it, lift tensors to inputs."""
        if self.broken is not None:  # (`not self.recording`, without the property call)
            return
        if isinstance(value, torch.Tensor):
            self._track_tensor(value, source)
            return
        if isinstance(value, G.CONSTANT_TYPES):
            if not isinstance(source, ConstSource):  # a held value is what it was
                self.guards.add(G.constant_guard(source, value))
            return
        seen = self.sources.get(id(value))
        if seen is not None:
            if seen[1] is not source and seen[1].describe() != source.describe():
                self.guards.add(G.same_guard(source, seen[1]))
            return
        self.sources[id(value)] = (value, source)
        if depth > 6:
            self.guards.add(G.id_guard(source, value))
            return
        if isinstance(value, torch.nn.Module):  # the common case, decided as below would
            if not isinstance(source, ConstSource):
                self.guards.add(G.id_guard(source, value))
            return
        if type(value) is tuple and all(type(v) in (int, str, bool, float) for v in value):
            self.guards.add(G.constant_guard(source, value))
        elif isinstance(value, containers.SEQUENCES):  # subclasses too, read as their base
            containers.track_sequence(self, value, source, depth)
        elif isinstance(value, dict):
            containers.track_dict(self, value, source, depth)
        elif isinstance(value, (set, frozenset)):
            containers.track_set(self, value, source, depth)
        elif type(value) is functools.partial:
            # a partial calls `func(*args, **keywords)`: each part is a fact of its own
            self.guards.add(G.type_guard(source, value))
            for part in ("func", "args", "keywords"):
                self.track(getattr(value, part), AttrSource(source, part), depth + 1)
        elif type(value) is types.FunctionType and not value.__closure__:
            # functions made by `def`/lambda/comprehensions are new objects on every call:
            # what matters is the code they run (and their defaults, guarded as values)
            self.guards.add(G.type_guard(source, value))
            self.guards.add(G.id_guard(AttrSource(source, "__code__"), value.__code__))
            self.track(value.__defaults__, AttrSource(source, "__defaults__"), depth + 1)
        elif isinstance(value, types.MethodType):  # a fresh object per access: guard its parts
            self.guards.add(G.type_guard(source, value))
            self.guards.add(G.id_guard(AttrSource(source, "__func__"), value.__func__))
            self.track(value.__self__, AttrSource(source, "__self__"), depth + 1)
        elif _identity_matters(value):
            if not isinstance(source, ConstSource):
                self.guards.add(G.id_guard(source, value))
        elif not numpy_values.lift(self, value, source):  # an ndarray: a graph input
            # other NumPy values by value (numpy_values.py), anything else by type
            self.guards.add(numpy_values.guard(source, value) or G.type_guard(source, value))

    def source_of(self, value: Any) -> Source | None:
        seen = self.sources.get(id(value))
        return seen[1] if seen is not None and seen[0] is value else None

    def _track_tensor(self, t: torch.Tensor, source: Source) -> None:
        with torch._C.DisableTorchFunction():  # kiln's own reads of the tensor's metadata
            self._track_tensor_unrecorded(t, source)

    def _track_tensor_unrecorded(self, t: torch.Tensor, source: Source) -> None:
        key = id(t)
        seen = self.sources.get(key)
        if seen is not None:
            if seen[1] is not source and seen[1].describe() != source.describe():
                self.guards.add(G.same_guard(source, seen[1]))
            return
        self.sources[key] = (t, source)
        self.keepalive.append(t)
        if key in self.tensor_nodes:  # made by this graph, read back through an outside path
            return
        node = self._placeholder(source)
        self.tensor_nodes[key] = node
        self.placeholders.append((source, t, node))
        if self.inference_read and source.row() is None:
            self.guards.add(G.inference_guard(source, t))
        if self.offset_read and source.row() is None:
            self.guards.add(G.offset_guard(source, t))
        dims = self.dynamic_policy(source, t) if self.dynamic_policy else ()
        if dims:
            dims = set(dims)
            if self.dyn is None:
                from .dynamic import DynamicShapes

                self.dyn = DynamicShapes()
                self._hold_intermediates()
            node.meta["example_value"] = self.dyn.fake_input(t, source, dims)
            self.guards.add(G.dynamic_tensor_guard(source, t, dims))
            if G.standard_contiguous(t):
                # its guard checks `is_contiguous()`, its dimension count and static sizes,
                # and the shape facts relate its symbolic sizes to every other input's: the
                # layout code generators index it with (contiguous over its symbolic sizes)
                # holds on every call that passes the guards. A strided input keeps the
                # generated code's own check: its strides are numbers there, not symbols.
                node.meta["kiln_layout_guarded"] = True
        else:
            if self.dyn is not None:
                node.meta["example_value"] = self.dyn.fake_of(t)
            else:
                self._example_later(node, t)
            self.guards.add(G.tensor_guard(source, t))
            # its type, dtype, device, sizes and strides are checked on every call: code
            # generators need not check them again (CaptureInfo.checked_inputs)
            node.meta["kiln_layout_guarded"] = True

    def _placeholder(self, source: Source) -> fx.Node:
        """A graph input fetched from `source`, named after it, before the first op."""
        desc = source.describe()
        name = self._fresh(_sanitize(desc))
        anchor = self._first_op
        # create_node with the name given: `graph.placeholder(name)` would also run the name
        # through FX's target-to-name conversion, which leaves a sanitized name as it is
        if anchor is None:
            node = self.graph.create_node("placeholder", name, name=name)
        else:
            with self.graph.inserting_before(anchor):
                node = self.graph.create_node("placeholder", name, name=name)
        node.meta["source"] = desc
        return node

    def release(self) -> None:
        """The traced call is over (and its entry installed): let go of the real values the
        trace kept alive (objects made in the call, intermediates held by id, the objects it
        read, its graph's inputs, its interpreter's frames). The tracer sits in reference
        cycles (its interpreter, closures over it), so without this they would live until the
        garbage collector found the cycles, which after a compile can be many steps later: a
        language model's first training step ran its backward with the traced forward's logits
        alive, and a traced optimizer step kept every gradient past `zero_grad`."""
        self.keepalive.clear()
        self.inlined.clear()  # (a closure made in the call holds its values)
        self._refs.clear()
        self.tensor_nodes.clear()
        self.sources.clear()  # every object the trace read, inputs included
        self.placeholders.clear()  # the graph's inputs (an optimizer step's gradients)
        interp = getattr(self, "interp", None)
        if interp is not None:
            interp.release()

    def _hold_intermediates(self) -> None:
        """From now on fakes are keyed by id: keep the graph's live intermediates alive."""
        self.keepalive += [t for t in (r() for r in self._refs.values()) if t is not None]
        self._refs.clear()

    def symbolic_value(self, value, source: Source, depth: int = 0, sized: bool = False):
        """Numbers (also inside plain lists/tuples, as `t.tolist()` gives) become symbolic
        inputs; anything else is tracked as usual. `sized`: the ints are sizes (symbolic
        before a graph break), symbols of the shape environment."""
        if type(value) in (int, float):
            return self.symbolic_scalar(value, source, sized)
        if type(value) in (list, tuple) and depth < 3 and len(value) <= 4096:
            self.guards.add(G.len_guard(source, value))
            items = [
                self.symbolic_value(v, ItemSource(source, i), depth + 1, sized)
                for i, v in enumerate(value)
            ]
            return items if type(value) is list else tuple(items)
        self.track(value, source)
        return value

    def symbolic_scalar(self, value, source: Source, sized: bool = False):
        """A Python number input that stays symbolic: a graph input guarded only by use."""
        node = self._placeholder(source)
        node.meta["example_value"] = value
        self.placeholders.append((source, value, node))
        self.guards.add(G.type_guard(source, value))
        from .sources import Namer

        fake = None
        if sized and type(value) is int:
            if self.dyn is None:
                from .dynamic import DynamicShapes

                self.dyn = DynamicShapes()
                self._hold_intermediates()
            fake = self.dyn.scalar_input(value, source)
        return make_sym(self, value, node, source.expr(Namer()), fake)

    def _fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self._names:
            name, k = f"{base}_{k}", k + 1
        self._names.add(name)
        return name

    # ---- torch calls --------------------------------------------------------------------------
    def on_torch_call(self, func, args, kwargs):
        if self.broken is not None:
            return func(*args, **kwargs)
        if func in _async_wrappers():  # a functional collective's result: wait for it now
            func = torch.ops._c10d_functional.wait_tensor.default  # (capture/collectives.py)
        info = call_info(func)
        kind = info.kind
        if kind != "call" and kind != "mutation":
            return self._not_recorded(info, func, args, kwargs)
        if info.name == "requires_grad_" and leaf_tensors.handled(self, args, kwargs):
            return args[0]  # a no-op, or a new leaf of autograd: a break (leaf_tensors.py)
        node_args = self._node_args(args)
        node_kwargs = {k: _map(self._as_arg, v) for k, v in kwargs.items()} if kwargs else {}
        if self._numpy_args:
            self._numpy_args = False
            self.graph_break(
                f"{info.label} reads a NumPy array's data, which a graph would keep as the "
                "traced call's constant",
                "make the tensor outside the compiled function, or keep the data in tensors",
            )
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        out_is_tensor = isinstance(out, torch.Tensor)
        if kind == "mutation" or info.in_place or "out" in kwargs:
            self.effects_visible = True
        elif out_is_tensor:
            for a in args:
                if a is out:  # returned a tensor it was given: changed it in place
                    self.effects_visible = True
        if not out_is_tensor and not _has_tensor(out) and kind != "mutation":
            if not _has_tensor(args) and not _has_tensor(tuple(kwargs.values())):
                return out  # a library's __torch_function__ protocol over Python values
            if type(out) is str and info.name == "type" and len(args) == 1:
                return out  # `x.type()`: 'torch.FloatTensor', from dtype and device alone
            self.graph_break(
                f"{info.label} returned a Python value ({type(out).__name__}) computed from "
                "tensors",
                "keep the value as a tensor, or move this code out of the compiled function",
            )
            return out
        if self.dyn is not None:
            try:
                self.dyn.propagate(func, args, kwargs, out)
            except Exception as e:  # noqa: BLE001 - the reason is reported
                self.graph_break(
                    f"{info.label} could not run with symbolic sizes ({type(e).__name__}: "
                    f"{str(e)[:120]})",
                    "mark fewer dimensions dynamic",
                )
                return out
        why = self.data_sized.note(info.name, info.label, args, kwargs, out)
        if why is not None:  # as many outputs as a size that depends on data says
            self.graph_break(why, data_sizes.HINT)
            return out
        op, target, a, k = node_target(info, node_args, node_kwargs)
        node = self._op_node(op, target, a, k)
        if self._first_op is None:
            self._first_op = node
        self._bind_outputs(out, node)
        return out

    def record_function_apply(self, cls: type, args: tuple, kwargs: dict):
        """`cls.apply(*args)` of a `torch.autograd.Function`: one graph node, run as a whole
        (its own backward is what autograd must use, so its forward's ops are not recorded
        one by one); AOT autograd differentiates it through that backward."""
        apply = _apply_function(cls)
        if self.broken is not None:
            return apply(*args, **kwargs)
        node_args = self._node_args(args)
        node_kwargs = {k: _map(self._as_arg, v) for k, v in kwargs.items()} if kwargs else {}
        with torch._C.DisableTorchFunction():
            out = apply(*args, **kwargs)
        if self.dyn is not None:
            try:
                self.dyn.propagate(apply, args, kwargs, out)
            except Exception as e:  # noqa: BLE001 - the reason is reported
                self.graph_break(
                    f"{cls.__qualname__}.apply could not run with symbolic sizes "
                    f"({type(e).__name__}: {str(e)[:120]})",
                    "mark fewer dimensions dynamic",
                )
                return out
        node = self._op_node("call_function", apply, node_args, node_kwargs)
        if self._first_op is None:
            self._first_op = node
        self._bind_outputs(out, node)
        return out

    def held_value(self, key: int):
        """The intermediate tensor of this id, while it lives (None once it died)."""
        ref = self._refs.get(key)
        return ref() if ref is not None else None

    def forget_nodes(self, gone: set) -> None:
        """Take recorded nodes out of the graph, and every table that names them."""
        for n in reversed(list(self.graph.nodes)):  # users before what they use
            if n in gone:
                self.graph.erase_node(n)
        for key in [k for k, n in self.tensor_nodes.items() if n in gone]:
            del self.tensor_nodes[key]
            self._refs.pop(key, None)
        self._examples = [e for e in self._examples if e[0] not in gone]
        if self._first_op in gone:
            self._first_op = next((n for n in self.graph.nodes if n.op != "placeholder"), None)

    def _not_recorded(self, info, func, args, kwargs):
        """A call that is no graph op: a metadata read (answered), iteration (a recorded
        unbind), a data read or a state change the graph cannot hold (a break)."""
        kind, name = info.kind, info.label
        why = self.data_sized.size_read("__len__" if kind == "iter" else info.name, args)
        if why is not None:  # a size that depends on data, into Python: a break
            self.graph_break(why, data_sizes.HINT)
            return func(*args, **kwargs)
        if kind == "metadata":
            if info.name == "is_inference" and not self.inference_read:
                self.note_inference_read()
            elif info.name == "storage_offset" and not self.offset_read:
                self.note_offset_read()
            if self.dyn is not None and args and isinstance(args[0], torch.Tensor):
                sym = symbolic_metadata(self, info.name, args, kwargs)
                if sym is not None:
                    return sym
            return func(*args, **kwargs)
        if kind == "iter":  # `for row in x`: iterate a recorded unbind, not an opaque iterator
            return iter(self.on_torch_call(torch.Tensor.unbind, (args[0],), {}))
        if kind == "data":
            self.graph_break(
                f"{name}() reads a Python value out of a tensor's data",
                "keep the value as a tensor (e.g. torch.where instead of `if`), or move this "
                "code out of the compiled function",
            )
        else:
            self.graph_break(f"{name} cannot be recorded in a graph ({_why(name)})")
        return func(*args, **kwargs)

    def note_inference_read(self) -> None:
        """The trace read whether a tensor is an inference tensor: a fact about the inputs it
        came from (a view of an inference input is one too), so every tensor input's kind is
        guarded, those read before and after."""
        self.inference_read = True
        for source, value, _ in self.placeholders:
            if isinstance(value, torch.Tensor) and source.row() is None:
                self.guards.add(G.inference_guard(source, value))

    def note_offset_read(self) -> None:
        """The trace read a storage offset: every tensor input's offset is guarded by value,
        those placed before and after (an intermediate's offset follows from its inputs')."""
        self.offset_read = True
        for source, value, _ in self.placeholders:
            if isinstance(value, torch.Tensor) and source.row() is None:
                self.guards.add(G.offset_guard(source, value))

    def _node_args(self, args: tuple) -> tuple:
        """The FX arguments of a call's positional arguments: tensors become their nodes
        (looked up here, the common case), anything else goes through `_as_arg`."""
        nodes = self.tensor_nodes
        out = []
        for a in args:
            t = type(a)
            if t is torch.Tensor or t is _Parameter:
                node = nodes.get(id(a))
                out.append(node if node is not None else self._lift_constant(a))
            elif t in _PLAIN_ARGS:
                out.append(a)
            else:
                out.append(_map(self._as_arg, a))
        return tuple(out)

    def _op_node(self, op: str, target, args: tuple, kwargs: dict) -> fx.Node:
        """A node for a recorded call. Made empty, then given its arguments: the same node as
        `create_node(op, target, args, kwargs)`, without that method's generic walk of the
        arguments looking for raw SymInts (kiln's symbolic numbers are nodes already), which
        costs as much as the rest of making a node, once per recorded call; and named as FX
        would, from a name worked out once per target."""
        name = self._node_names.get(id(target))  # (the graph's nodes keep their targets alive)
        if name is None:  # FX's name for the target, worked out once (a regex a node)
            name = self._node_names[id(target)] = self.graph._target_to_str(target)
        node = self.graph.create_node(op, target, name=name)
        _set_args(node, args)
        if kwargs:
            _set_kwargs(node, kwargs)
        return node

    def _as_arg(self, value):
        if isinstance(value, _Sym):
            return value._node
        if isinstance(value, slice):
            return slice(
                self._as_arg(value.start), self._as_arg(value.stop), self._as_arg(value.step)
            )
        if type(value) in (tuple, torch.Size) and any(isinstance(v, (slice, _Sym)) for v in value):
            return tuple(self._as_arg(v) for v in value)
        if isinstance(value, torch.Tensor):
            node = self.tensor_nodes.get(id(value))
            if node is None:
                return self._lift_constant(value)
            return node
        if type(value).__module__ == "numpy" and hasattr(value, "__array__"):
            self._numpy_args = True  # an ndarray or NumPy scalar: seen by on_torch_call
        return value

    def _lift_constant(self, t: torch.Tensor) -> fx.Node:
        name = self._fresh(f"_tensor_constant{len(self.constants)}")
        self.constants[name] = t
        anchor = self._first_op
        if anchor is None:
            node = self.graph.get_attr(name)
        else:
            with self.graph.inserting_before(anchor):
                node = self.graph.get_attr(name)
        self._first_op = node  # the earliest non-placeholder: inputs still go before it
        self._example_later(node, t)
        self.tensor_nodes[id(t)] = node
        self.keepalive.append(t)
        from .. import logs

        logs.log(
            "perf_hints",
            f"a tensor with no traced origin ({list(t.shape)}, {t.dtype}) became a graph "
            f"constant at {self.location_fn()}",
        )
        return node

    def _bind_outputs(self, out, node: fx.Node) -> None:
        if isinstance(out, torch.Tensor):
            fake = self.dyn.fakes.get(id(out)) if self.dyn is not None else None
            if fake is not None:
                node.meta["example_value"] = fake
            else:
                self._example_later(node, out)
            key = id(out)
            self.tensor_nodes[key] = node
            if self.dyn is not None:  # fakes are keyed by id too: keep the tensor
                self.keepalive.append(out)
            else:
                self._refs[key] = weakref.ref(out, lambda r, k=key: self._forget(k, r))
        elif isinstance(out, (tuple, list)):
            for i, item in enumerate(out):
                if isinstance(item, torch.Tensor):
                    sub = self._op_node("call_function", operator.getitem, (node, i), {})
                    self._bind_outputs(item, sub)

    def _example_later(self, node: fx.Node, t: torch.Tensor) -> None:
        """Note the sizes, strides and dtype of a real tensor; `example_values` gives the node
        its meta-tensor example value once the call has run."""
        self._examples.append((node, _layout(t)))

    def example_values(self) -> None:
        """Give the nodes noted by `_example_later` their `example_value`s (meta tensors).

        Made here, after the traced call, not as each op runs: a meta tensor is a small C++
        allocation that lives as long as the graph, and hundreds of them made between the real
        ops' allocations fragment the C heap, so the activations of a large model keep growing
        it into fresh pages (GPT-2's first call: 8,500 page faults instead of eager's 3,500,
        and 60-90 ms on a VM whose fresh pages cost ~15 us each)."""
        with torch._C.DisableTorchFunction():
            for node, layout in self._examples:
                node.meta["example_value"] = _meta_of(layout)
        self._examples.clear()

    def _forget(self, key: int, ref) -> None:
        """An intermediate died (as it would in eager, freeing its memory for reuse): its id
        may now name a new object, so it no longer names a graph value."""
        if self._refs.get(key) is ref:
            del self._refs[key]
            self.tensor_nodes.pop(key, None)

    def source_of_node(self, node: fx.Node) -> Source:
        return next(src for src, _, n in self.placeholders if n is node)

    def node_of(self, t: torch.Tensor) -> fx.Node:
        return self._as_arg(t)

    # ---- global state (grad mode, autocast) ---------------------------------------------------
    def sync_state(self) -> None:
        """After a native call: record a change of grad mode or autocast it made."""
        if self.broken is not None:
            return
        grad = torch.is_grad_enabled()
        if grad != self.grad_enabled:
            node = self.graph.call_function(torch._C._set_grad_enabled, (grad,))
            self._first_op = self._first_op or node
            self.grad_enabled = grad
        if _autocast_flat() == self._autocast_flat:  # (one tuple compare after every call)
            return
        state = _autocast_state()
        for dev, now in state.items():
            if now != self.autocast[dev]:
                node = self.graph.call_function(set_autocast, (dev, now[0], now[1]))
                self._first_op = self._first_op or node
        self.autocast = state
        self._autocast_flat = _autocast_flat()


def _apply_function(cls: type):
    """A plain function calling `cls.apply`, made once per class: a graph node's target that
    FX can name and generated code can call."""
    fn = cls.__dict__.get("_kiln_apply")
    if fn is None:

        def fn(*args, **kwargs):
            return cls.apply(*args, **kwargs)

        fn.__name__ = fn.__qualname__ = f"{cls.__name__}_apply"
        fn.__module__ = cls.__module__
        cls._kiln_apply = fn
    return fn


def set_autocast(device: str, enabled: bool, dtype: torch.dtype) -> None:
    """Graph node for entering/leaving autocast: set the state and keep its cache honest."""
    was = torch.is_autocast_enabled(device)
    torch.set_autocast_dtype(device, dtype)
    if enabled and not was:
        torch.autocast_increment_nesting()
    torch.set_autocast_enabled(device, enabled)
    if was and not enabled and torch.autocast_decrement_nesting() == 0:
        torch.clear_autocast_cache()


_AUTOCAST_DEVICES = ("cpu", "cuda")


# named module-level functions (not lambdas): a kept capture names its guards' readers
# (capture_cache.py)
def _autocast_cpu() -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")


def _autocast_cuda() -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")


_AUTOCAST_READERS = {"cpu": _autocast_cpu, "cuda": _autocast_cuda}


def _autocast_state() -> dict[str, tuple[bool, torch.dtype]]:
    return {dev: _AUTOCAST_READERS[dev]() for dev in _AUTOCAST_DEVICES}


def _autocast_flat() -> tuple:
    """_autocast_state's values as one flat tuple, read without building the dictionary."""
    is_on, dtype = torch.is_autocast_enabled, torch.get_autocast_dtype
    return (is_on("cpu"), dtype("cpu"), is_on("cuda"), dtype("cuda"))  # _AUTOCAST_DEVICES


def _why(name: str) -> str:
    return "it changes state outside the tensors it is given"


def _map(fn, x):
    """Apply fn to the leaves of (nested) tuples, lists and dicts: the shapes torch calls take.
    Much cheaper than a general pytree walk, which matters once per recorded call."""
    t = type(x)
    if t is tuple:
        return tuple(_map(fn, v) for v in x)
    if t is torch.Size and any(isinstance(v, _Sym) for v in x):  # sizes as graph values
        return tuple(_map(fn, v) for v in x)
    if t is list:
        return [_map(fn, v) for v in x]
    if t is dict:
        return {k: _map(fn, v) for k, v in x.items()}
    return fn(x)


def _has_tensor(x) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, (tuple, list)):
        return any(_has_tensor(v) for v in x)
    return False


def _identity_matters(value: Any) -> bool:
    return (
        isinstance(
            value,
            (
                contextvars.ContextVar,
                torch.nn.Module,
                types.FunctionType,
                types.BuiltinFunctionType,
                types.MethodType,
                types.ModuleType,
                type,
                types.CellType,
            ),
        )
        or callable(value)
        and not hasattr(value, "__dict__")
    )


_NOT_NAME = re.compile(r"[^0-9a-zA-Z_]+")


def _sanitize(text: str) -> str:
    s = _NOT_NAME.sub("_", text).strip("_").lower()
    return s or "arg"


def _layout(t: torch.Tensor) -> tuple | None:
    """(sizes, strides, dtype) of a tensor, read as plain Python values; None for a tensor
    without strides (sparse, nested)."""
    try:
        with torch._C.DisableTorchFunction():
            return tuple(t.shape), t.stride(), t.dtype
    except Exception:  # noqa: BLE001 - what cannot be described gets an empty example
        return None


def _meta_of(layout: tuple | None) -> torch.Tensor:
    if layout is not None:
        try:
            return torch.empty_strided(layout[0], layout[1], dtype=layout[2], device="meta")
        except Exception:  # noqa: BLE001 - keep what can be described
            pass
    return torch.empty(0, device="meta")


__all__ = ["Tracer", "Break", "set_autocast", "AttrSource"]
