"""The contract between capture and a backend: `CaptureInfo`, and the bound `Backend`.

Takes nothing; gives two frozen types. Capture hands every graph it captures to the backend
`kiln.compile` bound (`Backend`), together with one `CaptureInfo` of facts about that graph that
only capture knows. A backend that wants them says so with `takes_capture_info = True` (kiln's
own do) and is called as `backend(gm, example_inputs, info=CaptureInfo(...))`; any other
callable gets torch.compile's contract, `backend(gm, example_inputs)`. What a backend returns
may carry `explain_notes` (a tuple of lines): how it ran the graph when that differs from one
compiled graph (backends/ddp_split.py's pieces); `kiln.explain` prints them as `split:` lines.

Why it exists: capture imports no backend and no backend imports capture; what one stage tells
the next travels in a documented value, not in `gm.meta` keys (STYLE.md item 11).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .options import Options


@dataclass(frozen=True)
class CaptureInfo:
    """Facts about one captured graph, from capture to the backend.

    label: what the graph came from, for messages ("GPT2Model.forward").
    options: the frozen options of the `kiln.compile` call.
    static_inputs: positions of inputs that are parameters or buffers of the traced modules
        (state at one address from call to call: device graphs read them in place).
    checked_inputs: positions of tensor inputs whose sizes and strides capture's guards check
        on every call (a generated wrapper need not check them again).
    fixed_call_key: every input is a tensor with a tensor guard (requires_grad included) and the
        grad mode is guarded, so AOT autograd's per-call key cannot change between calls.
    """

    label: str = "a graph"
    options: Options = field(default_factory=Options)
    static_inputs: tuple[int, ...] = ()
    checked_inputs: tuple[int, ...] = ()
    fixed_call_key: bool = False


@dataclass(frozen=True)
class Backend:
    """A backend bound by `kiln.compile`: its name (or the callable) and the callable itself."""

    name: str
    fn: Callable
    takes_info: bool

    @classmethod
    def bind(cls, name: Any, fn: Callable) -> "Backend":
        label = name if isinstance(name, str) else getattr(fn, "__name__", repr(fn))
        return cls(label, fn, bool(getattr(fn, "takes_capture_info", False)))

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: list, info: CaptureInfo
    ) -> Callable:
        if self.takes_info:
            return self.fn(gm, example_inputs, info=info)
        return self.fn(gm, example_inputs)


def takes_capture_info(fn: Callable) -> Callable:
    """Mark a backend as one that takes `info=CaptureInfo(...)` (see the module doc)."""
    fn.takes_capture_info = True  # type: ignore[attr-defined]
    return fn
