"""Automatic garbage collection paused while kiln compiles.

A cold compile makes hundreds of thousands of objects (FX nodes, fake tensors, sympy
expressions, loop IR) and imports large modules (`torch._dynamo`, which `FakeTensorMode()`
imports, sympy, Triton), and many of them stay alive while it runs. CPython's collector runs a
full collection, over every object of the process, whenever the objects that outlived the young
generations have grown by a quarter of the old ones, so a compile keeps setting it off: a cold
nanoGPT training compile on the H200 host, its imports included, spent 0.32-0.35 s in three full
collections and 0.09-0.10 s in young ones (benchmarks/RESULTS.md, eleventh session).

`paused_gc()` turns automatic collection off for the duration of a compile step and back on
after it (only if it was on: a program that turned it off keeps it off). The compile's garbage
is then found by the first young collection after it, which looks at the objects the compile
made, not at the whole process; nothing is lost, a compile's cycles are freed a little later.
The pause covers kiln's own steps: capture's trace (which runs the user's code once, op by op),
the backend's compile of its graph, and AOT autograd's compile of a new call signature. Code
that runs after a graph break, eagerly or compiled, runs with the collector as the user left it.
The switch is the process's: while one thread compiles, other threads run without automatic
collection too.

`saved_tensor_hooks_suspended()` is the same kind of switch for autograd's saved-tensor hooks
(activation checkpointing): kiln's own steps run without them.
"""

from __future__ import annotations

import contextlib
import gc

import torch


@contextlib.contextmanager
def paused_gc():
    """Automatic garbage collection off inside, restored after (see the module doc)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def saved_tensor_hooks_suspended():
    """Saved-tensor hooks in force (a non-reentrant checkpoint, checkpoint_wrapper,
    `save_on_cpu`) belong to the tensors compiled graphs save when they run, not to kiln's
    work: AOT autograd's tracing on fake tensors (functorch refuses to trace under them) and a
    traced call's eager operations, whose saves a checkpoint's recompute (the compiled graph,
    saving other tensors) could not match. They are lifted meanwhile and put back in order."""
    ag = torch._C._autograd
    popped = []
    while (top := ag._top_saved_tensors_default_hooks(True)) is not None:
        popped.append(top)
        ag._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        for pack, unpack in reversed(popped):
            ag._push_saved_tensors_default_hooks(pack, unpack)
