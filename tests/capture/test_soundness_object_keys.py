"""Outside containers keyed by objects, container subclasses that override how they are read,
and the operations whose answer depends on which object a value is (`is`, `id`, lookups, a
class's own `__eq__`): each changed between calls, a compiled function recompiles or gives
eager's result, never the first call's (containers.py)."""

import collections
import dataclasses
import enum

import torch
from harness import CountingBackend, assert_same

import kiln


class Key:
    """Hashed and compared by identity (object's __eq__/__hash__)."""


class Mode(enum.Enum):
    A = 1
    B = 2


@dataclasses.dataclass(frozen=True)
class FrozenKey:
    v: int


@dataclasses.dataclass
class Point:
    v: float


A, B = Key(), Key()
BY_OBJECT = {A: 1.5}
STATE = {"key": A}


def _program(fn, mutations, eager_ok=False):
    """Run `fn` compiled and eager, after each mutation; both see the same outside state."""
    compiled = kiln.compile(fn, backend=CountingBackend())
    for mutate in [None, *mutations]:
        if mutate is not None:
            mutate()
        for _ in range(2):
            x = torch.randn(5)
            assert_same(compiled(x), fn(x))
    if not eager_ok:
        assert compiled._kiln_compiled.eager_reason is None
    return compiled


def test_global_dict_keyed_by_objects_mutated_between_calls():
    saved = dict(BY_OBJECT)

    def fn(x):
        return x * BY_OBJECT.get(A, 0.0) + x * BY_OBJECT.get(B, 0.0) + len(BY_OBJECT)

    try:
        _program(
            fn,
            [
                lambda: BY_OBJECT.__setitem__(B, 5.0),
                lambda: BY_OBJECT.__setitem__(A, 3.0),
                lambda: BY_OBJECT.pop(A),
            ],
        )
    finally:
        BY_OBJECT.clear()
        BY_OBJECT.update(saved)


def test_lookup_key_rebound_between_calls():
    table = {A: 1.0, B: 2.0, Mode.A: 3.0, Mode.B: 4.0}
    state = {"key": A, "mode": Mode.A}

    def fn(x):
        out = x * table.get(state["key"], 0.5) + x * table[state["mode"]]
        if state["key"] in table:
            out = out + 1
        return out

    def rebind(name, value):
        return lambda: state.__setitem__(name, value)

    _program(fn, [rebind("key", B), rebind("mode", Mode.B), rebind("key", Key())])


def test_dict_keyed_by_tensors():
    t1, t2 = torch.randn(2), torch.randn(2)
    weights = {t1: 2.0}
    which = [t1]

    def fn(x):
        return x * weights.get(which[0], -1.0)

    _program(
        fn,
        [
            lambda: weights.__setitem__(t1, 3.0),
            lambda: which.__setitem__(0, t2),
            lambda: weights.__setitem__(t2, 4.0),
        ],
    )


def test_keys_with_their_own_eq_are_looked_up_as_in_eager():
    table = {FrozenKey(1): 1.0, FrozenKey(2): 2.0}
    state = {"key": FrozenKey(1)}

    def fn(x):
        return x * table[state["key"]] + x * (FrozenKey(3) in table)

    _program(
        fn,
        [
            lambda: state.__setitem__("key", FrozenKey(2)),
            lambda: table.__setitem__(FrozenKey(3), 5.0),
        ],
        eager_ok=True,  # the lookup runs the dataclass's __eq__ natively: a graph break
    )


def test_keys_and_members_read_through_the_object():
    a, b = Point(1.5), Point(2.5)
    by_id = {Key(): a}
    members = {A}
    A.scale = 2.0

    def fn(x):
        for m in members:
            x = x * m.scale
        for _k, p in by_id.items():
            x = x + p.v
        return x

    def swap():
        by_id.clear()
        by_id[Key()] = b

    try:
        _program(fn, [lambda: setattr(A, "scale", 3.0), swap, lambda: setattr(b, "v", -1.0)])
    finally:
        del A.scale


def test_sets_and_lists_of_objects():
    objs = [A]
    s = {A}

    def fn(x):
        return x + (B in objs) + 2 * (B in s) + 4 * objs.count(B)

    _program(fn, [lambda: objs.__setitem__(0, B), lambda: s.add(B), lambda: objs.append(B)])


def test_identity_tests_and_ids():
    box = [A, B]

    def fn(x):
        out = x + 1 if box[0] is box[1] else x - 1
        if box[0] is A:
            out = out * 2
        return out + (id(box[1]) == id(A))

    _program(
        fn,
        [lambda: box.__setitem__(1, A), lambda: box.__setitem__(0, B), lambda: box.reverse()],
    )


def test_comparisons_run_the_classes_own_eq():
    p, q = Point(1.0), Point(1.0)

    def fn(x):
        out = x + 1 if p == q else x - 1
        return out * 2 if p != q else out

    _program(fn, [lambda: setattr(q, "v", 2.0), lambda: setattr(p, "v", 2.0)])


class DoublingList(list):
    def __getitem__(self, i):
        return super().__getitem__(i) * 2


class ReversedList(list):
    def __iter__(self):
        return iter(list(reversed(list(super().__iter__()))))

    def __len__(self):
        return super().__len__() + 1


class ShiftedDict(dict):
    def __getitem__(self, k):
        return super().__getitem__(k) + 10

    def get(self, k, default=None):
        return self[k] if k in self else default

    def items(self):
        return [(k, self[k]) for k in self]


class PairTuple(tuple):
    def __getitem__(self, i):
        return super().__getitem__(i) - 1


def test_container_subclasses_overriding_reads():
    dl, rl = DoublingList([1.0, 2.0]), ReversedList([1.0, 2.0, 3.0])
    sd = ShiftedDict(a=1.0)
    box = [PairTuple((1.0, 2.0))]

    def fn(x):
        out = x * dl[0] + x * sum(dl) + x * len(rl)
        for i, v in enumerate(rl):
            out = out + v * i
        out = out * sd["a"] + sd.get("b", 0.0)
        for _k, v in sd.items():
            out = out + v
        return out + box[0][1]

    _program(
        fn,
        [
            lambda: dl.__setitem__(0, 7.0),
            lambda: rl.append(4.0),
            lambda: rl.__setitem__(0, -2.0),
            lambda: sd.__setitem__("b", 2.0),
            lambda: sd.__setitem__("a", -1.0),
            lambda: box.__setitem__(0, PairTuple((5.0, 6.0))),
        ],
    )


class LoggingList(list):
    def __setitem__(self, i, v):
        self.log = [*getattr(self, "log", []), i]
        super().__setitem__(i, v * 3)

    def __delitem__(self, i):
        self.deleted = getattr(self, "deleted", 0) + 1
        super().__delitem__(i)


def test_subclass_setitem_override_runs_in_the_compiled_function():
    def fn(lst, x):
        lst[0] = x.sum()
        del lst[1]
        return x * lst[0]

    compiled = kiln.compile(fn, backend=CountingBackend())
    for _ in range(3):
        x = torch.randn(4)
        mine, theirs = LoggingList([1.0, 2.0, 3.0]), LoggingList([1.0, 2.0, 3.0])
        assert_same(compiled(mine, x), fn(theirs, x))
        assert_same(list(mine), list(theirs))
        assert mine.__dict__ == theirs.__dict__


def test_ordered_dict_order_and_counter():
    od = collections.OrderedDict(a=1.0, b=2.0)
    counts = collections.Counter(a=2)

    def fn(x):
        out = x
        for i, v in enumerate(od.values()):
            out = out * (i + 1) + v
        return out + counts["a"] + counts["z"]

    _program(fn, [lambda: od.move_to_end("a"), lambda: counts.update("a")])


def test_writes_to_an_overriding_dict_subclass_are_replayed_raw():
    """The residual program writes back the subclass's contents as the base dict holds them
    (an `items`/`__getitem__` override must not change what is written)."""

    def make():
        sd = ShiftedDict(a=0.5)

        def fn(x):
            sd["b"] = float(len(sd))
            return x * sd["a"]

        return fn, sd

    fn, mine = make()
    eager, theirs = make()
    compiled = kiln.compile(fn, backend=CountingBackend())
    for i in range(3):
        x = torch.randn(4)
        assert_same(compiled(x), eager(x))
        assert dict(dict.items(mine)) == dict(dict.items(theirs)), i
        for d in (mine, theirs):
            dict.pop(d, "b")
