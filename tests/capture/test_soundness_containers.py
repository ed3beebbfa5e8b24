"""Containers from outside the frame (globals, closure cells, attributes of outside objects),
mutated between calls: every fact a trace read from them is guarded, so a later call either
recompiles or gives eager's result, never the first call's."""

import collections

import pytest
import torch
from harness import CountingBackend, assert_same

import kiln

SET = {1, 2}
DICT = {"a": 1.5, "b": 2}
LIST = [1, 2, 3]
NESTED = {"k": [1, 2], "s": {3}, "d": {"x": [4.0]}}
TUPLE_KEYS = {(1, 2): 3.0, (2, 3): 4.0}
DEQUE = collections.deque([1.0, 2.0])


class Holder:
    pass


HOLDER = Holder()
HOLDER.items = [1.0, 2.0]


def _program(fn, mutations):
    """Run `fn` compiled and eager after each mutation; both see the same outside state."""
    compiled = kiln.compile(fn, backend=CountingBackend())
    x = torch.randn(5)
    assert_same(compiled(x), fn(x))
    for mutate in mutations:
        mutate()
        x = torch.randn(5)
        assert_same(compiled(x), fn(x))
        assert_same(compiled(x), fn(x))


def test_global_set_len_and_membership():
    saved = set(SET)

    def fn(x):
        return x * len(SET) + (1 if 3 in SET else 0)

    try:
        _program(fn, [lambda: SET.add(3), lambda: SET.discard(1), lambda: SET.clear()])
    finally:
        SET.clear()
        SET.update(saved)


def test_closure_set_and_list():
    s = {1}
    items = [2.0]

    def fn(x):
        return x * len(s) + sum(items)

    _program(fn, [lambda: s.add(4), lambda: items.append(3.0), lambda: items.__setitem__(0, -1.0)])


def test_global_dict_values_keys_and_reads():
    saved = dict(DICT)

    def fn(x):
        out = x * DICT["a"]
        if "c" in DICT:
            out = out + DICT["c"]
        for _k, v in DICT.items():
            out = out + v
        return out * DICT.get("b", 0) + len(DICT)

    def setc():
        DICT["c"] = 5

    def seta():
        DICT["a"] = -2.5

    try:
        _program(fn, [setc, seta, lambda: DICT.pop("b"), lambda: DICT.pop("c")])
    finally:
        DICT.clear()
        DICT.update(saved)


def test_global_list_length_items_and_aggregates():
    saved = list(LIST)

    def fn(x):
        return x * len(LIST) + LIST[0] + max(LIST) + sum(v for v in LIST)

    try:
        _program(
            fn,
            [lambda: LIST.append(10), lambda: LIST.__setitem__(0, -4), lambda: LIST.reverse()],
        )
    finally:
        LIST[:] = saved


def test_nested_containers():
    saved = {"k": [1, 2], "s": {3}, "d": {"x": [4.0]}}

    def fn(x):
        return x * sum(NESTED["k"]) + len(NESTED["s"]) + NESTED["d"]["x"][-1]

    try:
        _program(
            fn,
            [
                lambda: NESTED["k"].append(10),
                lambda: NESTED["s"].add(9),
                lambda: NESTED["d"]["x"].append(-3.0),
                lambda: NESTED["d"].__setitem__("x", [7.0]),
            ],
        )
    finally:
        NESTED.clear()
        NESTED.update(saved)


def test_dict_with_tuple_keys_and_a_deque():
    saved_d, saved_q = dict(TUPLE_KEYS), list(DEQUE)

    def fn(x):
        return x * TUPLE_KEYS[(1, 2)] + len(TUPLE_KEYS) + DEQUE[0] * len(DEQUE)

    def set12():
        TUPLE_KEYS[(1, 2)] = -1.0

    def add_key():
        TUPLE_KEYS[(5, 5)] = 0.0

    try:
        _program(fn, [set12, add_key, lambda: DEQUE.appendleft(6.0), lambda: DEQUE.pop()])
    finally:
        TUPLE_KEYS.clear()
        TUPLE_KEYS.update(saved_d)
        DEQUE.clear()
        DEQUE.extend(saved_q)


def test_attribute_container_of_an_outside_object():
    def fn(x):
        return x * len(HOLDER.items) + HOLDER.items[-1]

    saved = list(HOLDER.items)
    try:
        _program(fn, [lambda: HOLDER.items.append(5.0), lambda: HOLDER.items.__setitem__(-1, 0.5)])
    finally:
        HOLDER.items = saved


@pytest.mark.parametrize("kind", ["set", "frozenset"])
def test_set_argument_rebuilt_between_calls(kind):
    make = set if kind == "set" else frozenset

    def fn(x, s):
        return x * len(s) + (2 if "b" in s else 0)

    compiled = kiln.compile(fn, backend=CountingBackend())
    arg = make({"a"})
    for members in [{"a"}, {"a", "b"}, {"c"}, {"a", "b", "c"}]:
        x = torch.randn(4)
        arg = make(members) if kind == "frozenset" else arg
        if kind == "set":
            arg.clear()
            arg.update(members)
        assert_same(compiled(x, arg), fn(x, arg))
