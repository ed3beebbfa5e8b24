"""A process-wide version number of every nn.Module's structure.

Takes the modules compiled entries rely on (`watch`); gives `VERSION[0]`, bumped whenever one
of them registers a parameter, buffer or submodule (assignment, `register_*`, `add_module`;
torch's global registration hooks). A trace
that reached parameters and submodules through module attributes guards on this one number
instead of re-walking `self.layers[3].attn.proj.weight` on every call: while it is unchanged,
every such path still leads to the same object, so the residual holds the objects themselves.
"""

from __future__ import annotations

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


def install() -> None:
    global _installed
    if _installed:
        return
    _module.register_module_parameter_registration_hook(_bump)
    _module.register_module_buffer_registration_hook(_bump)
    _module.register_module_module_registration_hook(_bump)
    _installed = True
