"""Errors of the autograd stage, each naming the problem and a way out.

Takes nothing; gives `AotUnsupported` (a program shape kiln's AOT autograd does not handle) and
`DOUBLE_BACKWARD_MESSAGE`, raised from a compiled backward asked to build a graph of its own.
Messages follow STYLE.md item 7: what happened, then what the user can do about it.
"""

from __future__ import annotations


class AotUnsupported(NotImplementedError):
    """A graph kiln's AOT autograd refuses; `str()` reads "problem. Fix: hint"."""

    def __init__(self, problem: str, fix: str):
        self.problem = problem
        self.fix = fix
        super().__init__(f"kiln aot autograd: {problem}. Fix: {fix}.")


DOUBLE_BACKWARD_MESSAGE = (
    "kiln aot autograd: double backward is not supported. This graph's backward was compiled "
    "ahead of time and cannot itself be differentiated, but it was run with create_graph=True "
    "(torch.autograd.grad(..., create_graph=True) or .backward(create_graph=True), as used for "
    "gradient penalties and higher-order derivatives). Fix: compile this model with "
    "backend='eager' (kiln.compile(model, backend='eager')), or run the part that needs "
    "grads of grads outside the compiled function."
)
