"""Opcode handlers: class statements inside a compiled function, and the name lookups of
class bodies.

`class C(Base): ...` is LOAD_BUILD_CLASS, MAKE_FUNCTION (the body) and a CALL of
`__build_class__`. kiln does what `__build_class__` does (PEP 3115: bases resolved, metaclass
chosen, `__prepare__` called) but runs the body on its own interpreter, with the namespace as
the frame's `namespace`: what the body reads from outside (globals, the enclosing function's
variables) is guarded like any other read, so a class attribute taken from a global is
re-checked on later calls. The metaclass call itself (type.__new__, __init_subclass__,
__set_name__) runs natively. PyTorch's masked reductions define an autograd.Function this way.
"""

from __future__ import annotations

import builtins
import functools
import types

from .bytecode import opcode
from .ops_basic import load_global, op_load_deref

_BUILD_CLASS = builtins.__build_class__


@opcode("LOAD_BUILD_CLASS")
def op_load_build_class(interp, frame, inst):
    try:
        fn = frame.builtins["__build_class__"]
    except KeyError:
        raise NameError("__build_class__ not found") from None
    # kiln's own function is called natively (calls.py routes kiln.* so); it runs the body here
    frame.stack.append(functools.partial(build_class, interp) if fn is _BUILD_CLASS else fn)


def build_class(interp, func, name, /, *bases, **kwds):
    """`builtins.__build_class__`, with the class body run on kiln's interpreter."""
    from .interpreter import Frame

    if not isinstance(func, types.FunctionType):
        raise TypeError("__build_class__: func must be a function")
    if not isinstance(name, str):
        raise TypeError("__build_class__: name is not a string")
    resolved = types.resolve_bases(bases)
    meta, ns, kwds = types.prepare_class(name, resolved, kwds)
    body = Frame(func, {})
    body.namespace = ns
    _kind, cell = interp.run_frame(body)
    if resolved is not bases:
        ns["__orig_bases__"] = bases
    cls = meta(name, resolved, ns, **kwds)
    if isinstance(cls, type) and isinstance(cell, types.CellType):
        try:
            held = cell.cell_contents
        except ValueError:
            held = None
        if held is not cls:
            raise TypeError(
                f"__class__ set to {held!r} defining {name!r} as {cls!r}"
                if held is not None
                else f"__class__ not set defining {name!r} as {cls!r}. "
                "Was __classcell__ propagated to type.__new__?"
            )
    return cls


def _namespace(frame):
    ns = frame.namespace
    if ns is None:  # module-level code: kiln compiles functions only
        from .errors import AbortTrace

        raise AbortTrace("name lookups outside a class body (module-level code)")
    return ns


# ---- names in a class body ----------------------------------------------------------------------
@opcode("LOAD_NAME")
def op_load_name(interp, frame, inst):
    ns = frame.namespace
    name = inst.argval
    if ns is not None and name in ns:
        frame.stack.append(ns[name])
    else:
        frame.stack.append(load_global(interp, frame, name))


@opcode("STORE_NAME")
def op_store_name(interp, frame, inst):
    _namespace(frame)[inst.argval] = frame.stack.pop()


@opcode("DELETE_NAME")
def op_delete_name(interp, frame, inst):
    ns = _namespace(frame)
    try:
        del ns[inst.argval]
    except KeyError:
        raise NameError(f"name '{inst.argval}' is not defined") from None


@opcode("SETUP_ANNOTATIONS")
def op_setup_annotations(interp, frame, inst):
    ns = _namespace(frame)
    if "__annotations__" not in ns:
        ns["__annotations__"] = {}


@opcode("LOAD_CLASSDEREF", until=(3, 12))
def op_load_classderef(interp, frame, inst):
    """A free variable read in a class body: the namespace first, then the cell."""
    ns = frame.namespace
    if ns is not None and inst.argval in ns:
        frame.stack.append(ns[inst.argval])
    else:
        op_load_deref(interp, frame, inst)


@opcode("LOAD_LOCALS", since=(3, 12))
def op_load_locals(interp, frame, inst):
    frame.stack.append(_namespace(frame))


@opcode("LOAD_FROM_DICT_OR_DEREF", since=(3, 12))
def op_load_from_dict_or_deref(interp, frame, inst):
    mapping = frame.stack.pop()
    if inst.argval in mapping:
        frame.stack.append(mapping[inst.argval])
    else:
        op_load_deref(interp, frame, inst)


@opcode("LOAD_FROM_DICT_OR_GLOBALS", since=(3, 12))
def op_load_from_dict_or_globals(interp, frame, inst):
    mapping = frame.stack.pop()
    if inst.argval in mapping:
        frame.stack.append(mapping[inst.argval])
    else:
        frame.stack.append(load_global(interp, frame, inst.argval))
