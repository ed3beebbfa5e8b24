"""Side effects of a traced call on the world outside its frame, to replay on later calls.

Takes the stores the interpreter makes into objects that came from outside (attributes,
container items, globals, closure cells), `print` calls and effect-only calls (logging and
warnings: effect_calls.py); gives them back in program order (first occurrence) so the residual
program can write each location's *final* value, print the same text and make the same calls.
The trace itself already performed them for real on its own call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .sources import Source


@dataclass(frozen=True)
class Held:
    """An argument of a replayed call passed by identity (a module's warning registry), not
    rebuilt as a value."""

    obj: Any


@dataclass
class Effect:
    kind: str  # "attr" | "tensor_attr" | "container" | "global" | "cell" | "print" | "call"
    target: Any = None
    source: Source | None = None
    name: str = ""
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


class SideEffects:
    def __init__(self) -> None:
        self.effects: list[Effect] = []
        self._keys: set[tuple] = set()

    def _add(self, key: tuple, effect: Effect) -> None:
        if key not in self._keys:
            self._keys.add(key)
            self.effects.append(effect)

    def store_attr(self, obj: Any, source: Source, name: str) -> None:
        self._add(("attr", id(obj), name), Effect("attr", obj, source, name))

    def store_tensor_attr(self, t: Any, name: str) -> None:
        """An attribute set on a tensor (`.grad`, a user's own): the tensor is found again
        through its source or as a graph output."""
        self._add(("tattr", id(t), name), Effect("tensor_attr", t, None, name))

    def mutate_container(self, obj: Any, source: Source) -> None:
        self._add(("container", id(obj)), Effect("container", obj, source))

    def store_global(self, gdict: dict, source: Source, name: str) -> None:
        self._add(("global", id(gdict), name), Effect("global", gdict, source, name))

    def store_cell(self, cell: Any, source: Source) -> None:
        self._add(("cell", id(cell)), Effect("cell", cell, source))

    def print_call(self, args: tuple, kwargs: dict) -> None:
        self.effects.append(Effect("print", args=args, kwargs=kwargs))

    def call(self, fn: Any, args: tuple, kwargs: dict) -> None:
        """A call made only for its effect outside the program (a log line, a warning)."""
        self.effects.append(Effect("call", fn, args=args, kwargs=dict(kwargs)))

    def __bool__(self) -> bool:
        return bool(self.effects)
