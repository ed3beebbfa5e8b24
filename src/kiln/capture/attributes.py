"""Attribute access inside a trace: loads that guard what they read, stores that are replayed.

Takes an object and an attribute name as the interpreter meets them (LOAD_ATTR, STORE_ATTR,
`getattr`); gives the value, after telling the tracer where it came from: parameters, buffers
and submodules of a module are held directly under the module-structure guard, every other
attribute is guarded through its path. Python properties defined by user code are inlined.
"""

from __future__ import annotations

import types
from contextvars import Token
from typing import Any

import torch

from . import guards as G
from . import module_tree
from .sources import AttrSource, ConstSource, InstanceDictSource


def _lib(name: str) -> bool:
    from .calls import _is_library

    return _is_library(name)


def load_attr(interp, obj: Any, name: str, site=None) -> Any:
    """`obj.name` inside the trace. `site` is the frame whose LOAD_ATTR pushes the value: a
    property getter inlined from there can be resumed after a break, like a call."""
    tracer = interp.tracer
    if tracer.np_traced and id(obj) in tracer.np_traced and tracer.broken is None:
        from .numpy_trace import attribute

        return attribute(interp, obj, name)  # a traced NumPy value's attribute
    if isinstance(obj, torch.Tensor):
        if name == "grad" and tracer.broken is None:
            return _grad_of(tracer, obj)
        if tracer.broken is not None or hasattr(type(obj), name):  # a method or property
            return getattr(obj, name)
        return _tensor_instance_attr(tracer, obj, name)
    cls = type(obj)
    if cls is Token and tracer.recording:
        return tracer.context_vars.token_attr(obj, name)
    prop = _class_attr(cls, name)
    if (
        type(prop) is property
        and type(prop.fget) is types.FunctionType
        and _inlinable_fn(prop.fget)
    ):
        if name not in getattr(obj, "__dict__", {}):
            from .calls import interp_call

            return interp_call(interp, prop.fget, (obj,), {}, site)
    value = getattr(obj, name)
    if tracer.broken is None:
        # The same attribute of the same held object giving the same value again (attn.h, read
        # once a head): what the first read guarded covers it.
        key = (id(obj), name)
        seen = tracer.attr_reads.get(key, _NOTHING)
        if seen is value:
            return value
        src = tracer.source_of(obj)
        if src is not None and not _untracked(tracer, obj, name, value):
            tracer.track(value, _attr_source(tracer, obj, src, name, value))
            if seen is _NOTHING:
                tracer.attr_reads[key] = value
        elif type(obj) is types.ModuleType:  # (a library module, or a bound method of one)
            _hold_library_state(tracer, obj, name, value)
    return value


def _hold_library_state(tracer, module, name: str, value: Any) -> None:
    """A library module's attributes are not guarded (a library does not rebind `F.relu`), nor
    are bound methods, but an object behind them may carry state the program reads and
    changes: `random.gauss` is
    a method of the module's hidden Random instance, which keeps `gauss_next` between calls.
    That object is held by identity, so what the trace reads from its attributes is guarded
    and what it stores there is replayed."""
    target = value.__self__ if type(value) is types.MethodType else value
    if isinstance(target, (type, types.ModuleType, types.FunctionType, torch.nn.Module)):
        return
    if not hasattr(target, "__dict__") or tracer.source_of(target) is not None:
        return
    label = f"{module.__name__}.{name}" + (".__self__" if target is not value else "")
    tracer.sources[id(target)] = (target, ConstSource(target, label))


def _tensor_instance_attr(tracer, t: torch.Tensor, name: str) -> Any:
    """An attribute a program set on a tensor (`x.scale = 2`): a fact about that tensor
    object, guarded through its source when it has one; its absence (`hasattr(x, "tag")`
    false) is guarded too, as the name missing from the tensor's `__dict__`."""
    src = tracer.source_of(t)
    try:
        value = getattr(t, name)
    except AttributeError:
        if src is not None:
            tracer.guards.add(
                G.Guard(src, "NO_ATTR", f"{name!r} not in {{s}}.__dict__", {}, f"has no .{name}")
            )
        raise
    if src is not None and (id(t), name) not in tracer.mutated_attrs:
        tracer.track(value, AttrSource(src, name))
    return value


_NOTHING = object()


def _grad_of(tracer, t: torch.Tensor):
    """`p.grad` of a tensor the frame was given (a parameter an optimizer steps): an input of
    the graph fetched from `<p's source>.grad` on every call, or None under a guard that it
    still is. The gradient of a tensor the graph made, or one whose `.grad` this trace
    assigned, is no input: a graph break, as any state outside the graph's values."""
    with torch._C.DisableTorchFunction():  # kiln's own read, not a recorded call
        value = t.grad
    src = tracer.source_of(t)
    if src is None or (id(t), "grad") in tracer.mutated_attrs:
        tracer.graph_break(
            "Tensor.grad of a tensor made inside the compiled function cannot be recorded",
            "read .grad outside the compiled function, or of a tensor passed in",
        )
        return value
    tracer.track(value, AttrSource(src, "grad"))
    return value


_METHODS = (types.MethodType, types.BuiltinMethodType, types.MethodWrapperType)


def _untracked(tracer, obj, name, value) -> bool:
    if (id(obj), name) in tracer.mutated_attrs or id(obj) in tracer.mutated_objs:
        return True
    if isinstance(value, _METHODS):
        return True
    if isinstance(obj, types.ModuleType) and _lib(obj.__name__):
        return True
    return False


STRUCTURE = module_tree.STRUCTURE


def _attr_source(tracer, obj, src, name, value):
    """Parameters, buffers and submodules of a module are held directly, under the module-tree
    version guard (an empty slot too: `conv.bias` is None, and registering a parameter, buffer or
    submodule there bumps the version); other attributes of a held module are read from its
    instance dictionary; every other attribute is read through its path."""
    if isinstance(obj, torch.nn.Module):
        d = obj.__dict__
        structural = name in STRUCTURE or (
            (value is None or isinstance(value, (torch.Tensor, torch.nn.Module)))
            and (
                name in d.get("_parameters", ())
                or name in d.get("_modules", ())
                or name in d.get("_buffers", ())
            )
        )
        if structural:
            _tree_guard(tracer)
            module_tree.watch(obj)
            label = f"{src.describe()}.{name}"
            if name in STRUCTURE:  # the dict itself: its entries are structure too
                tracer.sources[id(value)] = (value, ConstSource(value, label))
                for k, v in value.items():
                    if isinstance(v, (torch.Tensor, torch.nn.Module)):
                        tracer.track(v, ConstSource(v, f"{label}[{k!r}]"))
            return ConstSource(value, label)
        if isinstance(src, ConstSource) and name in d and not _data_descriptor(type(obj), name):
            return InstanceDictSource(instance_dict_guard(tracer, src), name)
    return AttrSource(src, name)


def instance_dict_guard(tracer, src: ConstSource) -> ConstSource:
    """Reads through a held object's `__dict__` are valid while it keeps that dictionary."""
    if id(src.obj) not in tracer.dict_guarded:  # (held objects live as long as the trace)
        tracer.dict_guarded.add(id(src.obj))
        tracer.guards.add(G.dict_guard(src, src.obj.__dict__))
    return src


def _data_descriptor(cls: type, name: str) -> bool:
    attr = _class_attr(cls, name)
    return hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__")


def _tree_guard(tracer) -> None:
    if tracer.tree_guarded:  # one guard per trace covers every structural read
        return
    tracer.tree_guarded = True
    module_tree.install()
    tracer.guards.add(
        G.Guard(
            None,
            "TREE",
            "{v}[0] == " + str(module_tree.VERSION[0]),
            {"v": module_tree.VERSION},
            "nn.Module structure unchanged",
        )
    )


def python_dunder(obj, name: str):
    """The user-level (Python) implementation of a dunder on obj's type, or None."""
    if isinstance(obj, torch.Tensor):
        return None
    fn = _class_attr(type(obj), name)
    if type(fn) is types.FunctionType and (_inlinable_fn(fn) or _mixin(fn, obj)):
        return fn
    return None


def _mixin(fn, obj) -> bool:
    from .calls import _mixin_on_user_object

    return _mixin_on_user_object(fn, obj)


def store_attr(interp, obj: Any, name: str, value: Any) -> None:
    tracer = interp.tracer
    if isinstance(obj, torch.Tensor):
        if name == "grad" or not hasattr(type(obj), name):
            return _store_tensor_attr(tracer, obj, name, value)
        tracer.graph_break(
            f"assignment to tensor attribute .{name}", "do it outside the compiled function"
        )
    setattr(obj, name, value)
    tracer.mutated_attrs.add((id(obj), name))
    src = tracer.source_of(obj)
    if src is not None:
        tracer.side_effects.store_attr(obj, src, name)
        tracer.effects_visible = True


def _store_tensor_attr(tracer, t: torch.Tensor, name: str, value: Any) -> None:
    """`x.grad = g`, `x.tag = ...`: done now, and replayed by the residual program on the
    tensor it rebuilds (an input through its source, a graph output), with the final value."""
    with torch._C.DisableTorchFunction():  # the `.grad` setter is no op of the program
        setattr(t, name, value)
    tracer.mutated_attrs.add((id(t), name))
    if tracer.recording:
        tracer.side_effects.store_tensor_attr(t, name)
        tracer.effects_visible = True


def delete_attr(interp, obj: Any, name: str) -> None:
    store_attr_like = interp.tracer
    delattr(obj, name)
    store_attr_like.mutated_attrs.add((id(obj), name))
    src = store_attr_like.source_of(obj)
    if src is not None:
        store_attr_like.side_effects.store_attr(obj, src, name)
        store_attr_like.effects_visible = True


def _class_attr(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


def _inlinable_fn(fn) -> bool:
    from .calls import _inlinable

    return _inlinable(fn)
