"""Fake runs with symbolic sizes under the Python dispatcher: one rule for capture and AOT.

Takes a thunk that runs ATen ops on fake tensors (capture's propagation of one call, AOT
autograd's analysis or trace of a graph); gives its result, computed first with
`enable_python_dispatcher()` on when sizes are symbolic.

Why: some of ATen's C++ composite kernels read concrete sizes (on torch 2.11 `linear` ->
`matmul`'s fold check when no operand needs a gradient; `constant_pad_nd`'s meta). On symbolic
sizes they either fail or pin a symbol to its hint with a guard that fixes the length (GPT-2 on
CUDA compiled once per prompt length). Under the Python dispatcher their SymInt-aware Python
decompositions (torch._decomp) run instead, as make_fx's symbolic mode and torch.compile's fake
propagation run them. A few meta kernels fail under the dispatcher instead (baddbmm's broadcast
`expand` on torch 2.13): then the thunk runs again as before. Static runs are unchanged.

A base module (capture and autograd both use it and may not import each other).
"""

from __future__ import annotations

from typing import Any, Callable


def run_symbolic(symbolic: bool, run: Callable[[], Any]) -> Any:
    """`run()`; when `symbolic`, first under the Python dispatcher, then plainly if that raises
    a RuntimeError (see the module doc)."""
    if not symbolic:
        return run()
    from torch._dispatch.python import enable_python_dispatcher

    try:
        with enable_python_dispatcher():
            return run()
    except RuntimeError:
        return run()
