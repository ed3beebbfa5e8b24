"""Floats in dicts that change between calls: graph inputs instead of constants.

Takes the float items the tracer meets while it tracks a held dict, and the frontend's policy
(automatic, like TorchDynamo's for sizes: a float is dynamic once a trace reads a different value
at the same source than the trace before it); gives, for `d[k]` and `d.get(k)`, a symbolic float
input (symbolic.py) whose guard checks only its type, so the next value reuses the compiled entry.

Why: a learning-rate scheduler writes a new `group["lr"]` into an optimizer's `param_groups`
every step; guarded as a constant, each step would compile the optimizer step again.

Soundness: such an item is left unguarded only while the trace reads it through `d[k]` or
`d.get(k)`. Every other way the dict can reach code kiln does not record (`d.items()`, `**d`,
`dict(d)`, a native call taking `d`) specializes its dynamic items first: their exact values
are guarded, as any constant is.
"""

from __future__ import annotations

from typing import Any, Callable

from . import guards as G
from .sources import Source


class FloatSlots:
    def __init__(self, tracer) -> None:
        self.tracer = tracer
        self.policy: Callable[[Source, float], bool] | None = None  # set by the frontend
        # id(dict) -> (dict, {key: (source, value read)}): dynamic items not guarded by value
        self.slots: dict[int, tuple[dict, dict[Any, tuple[Source, float]]]] = {}
        self._syms: dict[str, Any] = {}  # source -> its symbolic float, one input per source

    def offer(self, container: dict, key: Any, value: Any, source: Source) -> bool:
        """From `track`'s walk of a dict: True when the item is a dynamic float, now held here
        (the caller guards only its type); False for everything else (guarded as usual)."""
        if type(value) is not float or self.policy is None or not self.policy(source, value):
            return False
        self.slots.setdefault(id(container), (container, {}))[1][key] = (source, value)
        return True

    def read(self, container: Any, key: Any) -> Any:
        """`container[key]` as the trace goes on with it: the symbolic float of a held item,
        or None when the item is no dynamic float."""
        entry = self.slots.get(id(container))
        if entry is None or entry[0] is not container:
            return None
        slot = entry[1].get(key)
        if slot is None or container.get(key) is not None and type(container[key]) is not float:
            return None
        source, value = slot
        label = source.describe()
        sym = self._syms.get(label)
        if sym is None:
            sym = self._syms[label] = self.tracer.symbolic_scalar(value, source)
        return sym

    def escape(self, *values: Any) -> None:
        """`values` reach code kiln does not record: a dict among them (or in a list or tuple
        among them) has its dynamic items guarded by value from now on."""
        for v in values:
            if isinstance(v, dict):
                self._specialize(v)
            elif isinstance(v, (list, tuple)):
                for item in v[:256]:
                    if isinstance(item, dict):
                        self._specialize(item)
                    elif isinstance(item, (list, tuple)):
                        self.escape(*item[:256])

    def _specialize(self, container: dict) -> None:
        entry = self.slots.pop(id(container), None)
        if entry is None or entry[0] is not container:
            return
        for source, value in entry[1].values():
            self.tracer.guards.add(G.constant_guard(source, value))
