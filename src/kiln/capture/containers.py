"""Guards for the contents of containers read from outside the frame, and for lookups in them.

Takes a list, tuple, deque or dict the trace read from outside (a global, a closure cell, an
attribute, an argument) and the lookups the interpreter makes in outside containers; gives the
guards that make every fact the trace drew from them hold on later calls.

Why: native code (`len(d)`, `d.get(k)`, `sum(l)`, `k in s`) reads a container's contents
without the interpreter seeing each read, so a traced container's whole contents are guarded
when it is first read, and a lookup's answer is kept only while the key it looked up is the
object it was:

- keys that are constants are compared by value; keys hashed and compared by identity (plain
  objects, modules, tensors, enum members) by identity, which holds them alive, so an id can
  not be reused; keys whose class defines its own `__eq__` by identity too (the contents are
  then pinned object by object), and a lookup with such a key is a graph break, since the
  lookup runs the class's Python code unseen;
- a subclass of list/dict/tuple is guarded through the built-in base class's own methods
  (`list.__getitem__(l, 0)`): a guard must not run an override (the interpreter runs the
  overrides the program calls, and what they read is guarded as it is read), and what the
  base methods hold is what native code sees.
"""

from __future__ import annotations

import collections
import operator
from typing import Any

import torch

from . import guards as G
from .sources import ConstSource, ItemSource, Source

_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a `class` statement
SEQUENCES = (list, tuple, collections.deque)
_PLAIN = frozenset((list, tuple, collections.deque, dict, collections.OrderedDict))


def builtin_base(cls: type) -> type:
    """The nearest class of `cls`'s MRO written in C (list, dict, OrderedDict, defaultdict):
    its methods read and change the contents without running a Python subclass's overrides."""
    return next(c for c in cls.__mro__ if not c.__flags__ & _HEAP_TYPE)


def raw_type(value: Any) -> type | None:
    """The C base class guards read `value`'s contents through, or None for a built-in
    container read as such (`len(l)`, `l[0]`: nothing of the user's can run)."""
    cls = type(value)
    if cls in _PLAIN or not cls.__flags__ & _HEAP_TYPE:
        return None
    return builtin_base(cls)


def track_sequence(tracer, value, source: Source, depth: int) -> None:
    raw = raw_type(value)
    tracer.guards.add(len_guard(source, value, raw))
    for i, item in enumerate(_raw_items(value, raw)):
        tracer.track(item, ItemSource(source, i, raw=raw), depth + 1)


def track_dict(tracer, value: dict, source: Source, depth: int) -> None:
    raw = raw_type(value)
    keys = tuple(raw.__iter__(value)) if raw is not None else tuple(value)
    tracer.guards.add(keys_guard(source, value, keys, raw))
    getitem = raw.__getitem__ if raw is not None else dict.__getitem__
    for i, k in enumerate(keys):
        item = getitem(value, k)
        label = ""
        if not constant_key(k):
            label = _key_label(tracer, k)
            _track_member(tracer, k, source, f".keys()[{i}]", depth)
        item_src = ItemSource(source, k, label, raw)
        if type(item) is float and tracer.float_slots.offer(value, k, item, item_src):
            tracer.guards.add(G.type_guard(item_src, item))  # see dynamic_floats
            continue
        tracer.track(item, item_src, depth + 1)


def track_set(tracer, value: set | frozenset, source: Source, depth: int) -> None:
    """A set's members, against a frozen copy (the set itself may change); members compared
    by identity (plain objects) or by their own Python `__eq__` are held and compared by
    identity, and read through the object held (see _track_member)."""
    raw = raw_type(value)
    members = tuple(value if raw is None else raw.__iter__(value))
    held: dict[str, Any] = {"t": type(value)}
    it = "{s}"
    if raw is not None:
        held["r"], it = raw, "{r}.__iter__({s})"
    if raw is None and all(map(_eq_sound, members)):
        tracer.guards.add(G.members_guard(source, value))
    elif all(map(_eq_sound, members)):
        held["v"] = frozenset(members)
        check = "type({s}) is {t} and frozenset(" + it + ") == {v}"
        tracer.guards.add(G.Guard(source, "MEMBERS", check, held, f"has {len(members)} members"))
    else:
        # the members themselves are held too: their ids stay theirs
        held["ids"], held["m"] = frozenset(map(id, members)), members
        check = f"type({{s}}) is {{t}} and set(map(id, {it})) == {{ids}}"
        text = f"is a {type(value).__name__} of the same {len(members)} objects"
        tracer.guards.add(G.Guard(source, "MEMBER_IDS", check, held, text))
    for i, m in enumerate(members):
        if not constant_key(m):
            _track_member(tracer, m, source, f"[member {i}]", depth)


def _track_member(tracer, obj, source: Source, where: str, depth: int) -> None:
    """A dictionary key or set member that is an object (not a constant): the guard of its
    container pins which object it is, so what the trace reads from it (its attributes) is
    read through the object held, and guarded as such."""
    if isinstance(obj, torch.Tensor) or tracer.source_of(obj) is not None:
        return
    tracer.track(obj, ConstSource(obj, source.describe() + where), depth + 1)


def _raw_items(value, raw: type | None):
    return value if raw is None else raw.__iter__(value)


def _key_label(tracer, key) -> str:
    src = tracer.source_of(key)
    return src.describe() if src is not None else f"<{type(key).__name__} at {id(key):#x}>"


def constant_key(key) -> bool:
    """A dictionary key compared by value (guards hold an equal copy)."""
    if type(key) is tuple:
        return all(map(constant_key, key))
    return isinstance(key, G.CONSTANT_TYPES)


def identity_eq(key) -> bool:
    """A key compared by identity: two such keys are equal only when they are one object (a
    tensor's `==` is elementwise, but dicts and sets hash and compare tensors by identity)."""
    return isinstance(key, torch.Tensor) or type(key).__eq__ is object.__eq__


def _eq_sound(key) -> bool:
    """`==` decides whether `key` is the key a guard holds: a constant, an identity-compared
    object other than a tensor, or a tuple of those."""
    if type(key) is tuple:
        return all(map(_eq_sound, key))
    return isinstance(key, G.CONSTANT_TYPES) or (
        not isinstance(key, torch.Tensor) and type(key).__eq__ is object.__eq__
    )


def len_guard(source: Source, value: Any, raw: type | None) -> G.Guard:
    if raw is None:
        return G.len_guard(source, value)
    n = raw.__len__(value)
    return G.Guard(
        source,
        "LEN",
        "type({s}) is {t} and {r}.__len__({s}) == " + str(n),
        {"t": type(value), "r": raw},
        f"is a {type(value).__name__} of length {n}",
    )


def keys_guard(source: Source, value: dict, keys: tuple, raw: type | None) -> G.Guard:
    """The dictionary's keys in order: compared by `==` when that decides identity or value
    (constants, plain objects), else object by object with `is` (tensors, keys with their own
    `__eq__`, whose Python code a guard must not run)."""
    it = "{s}" if raw is None else "{r}.__iter__({s})"
    held: dict[str, Any] = {"t": type(value), "k": keys}
    if raw is not None:
        held["r"] = raw
    if all(map(_eq_sound, keys)):
        check = "type({s}) is {t} and tuple(" + it + ") == {k}"
        kind = "KEYS"
    else:
        held["is_"] = operator.is_
        size = "len({s})" if raw is None else "{r}.__len__({s})"
        check = (
            "type({s}) is {t} and " + size + f" == {len(keys)} and all(map({{is_}}, {it}, {{k}}))"
        )
        kind = "KEY_IDS"

    def text() -> str:
        shown = [k if constant_key(k) else f"<{type(k).__name__}>" for k in keys]
        return f"is a {type(value).__name__} with keys {shown!r:.80}"

    return G.Guard(source, kind, check, held, text)


def pin_lookup(tracer, container, key) -> None:
    """A lookup of `key` in `container` is about to run natively (`d[k]`, `d.get(k)`,
    `k in s`, `l.index(k)`): its answer depends on which object `key` is, and, for a class
    with its own `__eq__`, on that Python code, which native code runs unseen. Pin the key's
    identity (the container's contents are guarded when it is tracked), or break the graph."""
    if not tracer.recording or constant_key(key):
        return
    if identity_eq(key):
        src = tracer.source_of(key)
        if src is not None and not isinstance(src, ConstSource):  # (a held one is itself)
            # a tensor too: eager finds the item only for the same tensor object, not for
            # one with equal metadata
            tracer.guards.add(G.id_guard(src, key))
        if isinstance(container, SEQUENCES):  # `k in l` compares k with each item
            _pin_items(tracer, container)
        return
    if _from_outside(tracer, container, key):
        tracer.graph_break(
            f"a lookup with a key of class {type(key).__qualname__}, whose __eq__/__hash__ "
            "are Python code that native dict/set/list code runs without kiln seeing it",
            "key the container by plain values (strings, numbers, tuples of them) or by the "
            "objects themselves (default __eq__), or do the lookup outside the compiled function",
        )


def _pin_items(tracer, seq) -> None:
    """`k in l`, `l.index(k)`: identity-compared items of an outside sequence, pinned."""
    for item in seq:
        if not constant_key(item) and identity_eq(item):
            src = tracer.source_of(item)
            if src is not None and not isinstance(src, ConstSource):
                tracer.guards.add(G.id_guard(src, item))


def pin_identity_test(tracer, lhs, rhs) -> None:
    """`lhs is rhs` of two objects (not constants, whose type guard decides it): two from
    outside stay the same or distinct objects; one from outside whose partner came from
    native code (a key of a guarded dict) stays the object it is."""
    if constant_key(lhs) or constant_key(rhs):
        return
    a, b = tracer.source_of(lhs), tracer.source_of(rhs)
    if a is not None and b is not None:
        if lhs is rhs:
            if a.describe() != b.describe():
                tracer.guards.add(G.same_guard(a, b))
        else:
            tracer.guards.add(
                G.Guard(a, "NOT_SAME", "{s} is not {o}", {}, f"is not the object {b}", b)
            )
        return
    for value, src in ((lhs, a), (rhs, b)):
        if src is not None and not isinstance(src, ConstSource):
            tracer.guards.add(G.id_guard(src, value))


def _from_outside(tracer, container, key) -> bool:
    if tracer.source_of(key) is not None or tracer.source_of(container) is not None:
        return True
    members = container.keys() if isinstance(container, dict) else container
    try:
        return any(tracer.source_of(k) is not None for k in members)
    except TypeError:
        return True


# containers `k in c` looks `k` up in natively
LOOKED_IN = (dict, set, frozenset, list, tuple, collections.deque, type({}.keys()))
# methods of the built-in containers whose first argument is looked up in the container
LOOKUPS = frozenset(
    ("get", "pop", "setdefault", "__contains__", "__getitem__", "index", "count", "remove")
)
