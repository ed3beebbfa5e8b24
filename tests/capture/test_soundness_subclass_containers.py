"""Inputs that are subclasses of list/dict (and the collections types): in-place changes a
compiled function makes reach the caller's object on every call, a subclass's overrides run as
in eager, and reads of the subclass's contents are guarded like a plain list's or dict's."""

import collections

import pytest
import torch
from harness import CountingBackend, assert_same

import kiln


class MyList(list):
    pass


class CountingList(list):
    """Overrides the in-place methods: eager runs the override, so must kiln."""

    def append(self, v):
        self.appends = getattr(self, "appends", 0) + 1
        super().append(v * 2)

    def __setitem__(self, k, v):
        super().__setitem__(k, v + 100)


class MyDict(dict):
    pass


class TripleDict(dict):
    def __setitem__(self, k, v):
        super().__setitem__(k, v * 3)


def _list_ops(lst, x):
    lst.append(x + 1)
    lst.extend([x, x * 3])
    lst[0] = x * 2
    lst += [x - 1]
    lst.insert(1, x.sin())
    last = lst.pop()
    return x + last


def _dict_ops(d, x):
    d["a"] = x
    d.update(b=x + 1)
    d.pop("z", None)
    d.setdefault("c", x.cos())
    return x * 2


def _state(obj):
    contents = dict(obj) if isinstance(obj, dict) else list(obj)
    return type(obj), contents, dict(getattr(obj, "__dict__", {}))


def _run(fn, make):
    compiled = kiln.compile(fn, backend=CountingBackend())
    for _ in range(3):
        x = torch.randn(3)
        mine, theirs = make(), make()
        assert_same(compiled(mine, x), fn(theirs, x))
        got, expected = _state(mine), _state(theirs)
        assert got[0] is expected[0]
        assert_same(got[1], expected[1], "contents after the call")
        assert_same(got[2], expected[2], "attributes after the call")
    assert compiled._kiln_compiled.eager_reason is None


@pytest.mark.parametrize(
    "make",
    [
        lambda: MyList([torch.ones(3)]),
        lambda: CountingList([torch.ones(3)]),
        lambda: collections.UserList([torch.ones(3)]),
    ],
    ids=["subclass", "overriding", "UserList"],
)
def test_list_subclass_in_place_methods(make):
    _run(_list_ops, make)


@pytest.mark.parametrize(
    "make",
    [
        lambda: MyDict(z=1),
        lambda: TripleDict(z=1),
        lambda: collections.OrderedDict(z=1),
        lambda: collections.defaultdict(int, z=1),
        lambda: collections.UserDict(z=1),
    ],
    ids=["subclass", "overriding", "OrderedDict", "defaultdict", "UserDict"],
)
def test_dict_subclass_in_place_methods(make):
    _run(_dict_ops, make)


def test_defaultdict_missing_key_is_inserted():
    def fn(d, x):
        d["new"].append(x + 1)
        return x * len(d)

    _run(fn, lambda: collections.defaultdict(list, old=[torch.zeros(3)]))


def test_subclass_contents_are_guarded():
    def fn(lst, d, x):
        out = x * len(lst) + sum(lst)
        if "k" in d:
            out = out + d["k"]
        return out + len(d)

    compiled = kiln.compile(fn, backend=CountingBackend())
    lst, d = MyList([1.0, 2.0]), MyDict(a=1)
    for change in [None, lambda: lst.append(5.0), lambda: d.update(k=3.0), lambda: lst.pop(0)]:
        if change is not None:
            change()
        x = torch.randn(3)
        assert_same(compiled(lst, d, x), fn(lst, d, x))
