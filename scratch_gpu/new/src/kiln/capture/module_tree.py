"""A process-wide version number of every nn.Module's structure.

Takes the modules compiled entries rely on (`watch`); gives `VERSION[0]`, bumped whenever one
of them registers a parameter, buffer or submodule (assignment, `register_*`, `add_module`;
torch's global registration hooks), empties a parameter slot (`m.bias = None`, which torch
reports to no hook) or deletes one (`del m.bias`). A trace that reached parameters and
submodules through module attributes guards on this one number instead of re-walking
`self.layers[3].attn.proj.weight` on every call: while it is unchanged, every such path still
leads to the same object, so the residual holds the objects themselves.

Not seen: writing a module's `_parameters`/`_buffers`/`_modules` dictionaries directly.
"""

from __future__ import annotations

import functools

import torch.nn.modules.module as _module

VERSION = [0]
_installed = False
_suspended = [0]


def _bump(module, *_args):
    # Only modules a compiled entry relies on count: building a new module (transformers makes
    # cache objects every call) must not invalidate every entry.
    if not _suspended[0] and module.__dict__.get("_kiln_watched"):
        VERSION[0] += 1
    return None


def watch(module) -> None:
    """Changes to `module`'s parameters, buffers or submodules bump VERSION from now on."""
    module.__dict__["_kiln_watched"] = True


class suspended:
    """kiln's own modules (a graph module holding constants) do not count as user changes."""

    def __enter__(self):
        _suspended[0] += 1

    def __exit__(self, *exc):
        _suspended[0] -= 1


STRUCTURE = ("_parameters", "_buffers", "_modules")  # the dictionaries that are structure


def _reporting_register_parameter(register_parameter):
    """`register_parameter(name, None)` calls no registration hook: bump for it here."""

    @functools.wraps(register_parameter)
    def wrapper(self, name, param):
        register_parameter(self, name, param)
        if param is None:
            _bump(self)

    return wrapper


def _reporting_delattr(delattr_):
    """`del module.name` of a parameter, buffer or submodule calls no hook either."""

    @functools.wraps(delattr_)
    def wrapper(self, name):
        d = self.__dict__
        structural = any(name in d.get(k, ()) for k in STRUCTURE)
        delattr_(self, name)
        if structural:
            _bump(self)

    return wrapper


def install() -> None:
    global _installed
    if _installed:
        return
    _module.register_module_parameter_registration_hook(_bump)
    _module.register_module_buffer_registration_hook(_bump)
    _module.register_module_module_registration_hook(_bump)
    # torch has no hook for the two ways a slot empties; wrapping Module's own methods (which
    # subclasses' __setattr__/__delattr__ reach through super()) is the one place to see them
    Module = _module.Module
    Module.register_parameter = _reporting_register_parameter(Module.register_parameter)
    Module.__delattr__ = _reporting_delattr(Module.__delattr__)
    _installed = True
