"""Symbolic numbers never reach the user: where eager returns (or stores, or passes to code run
eagerly) an `int`, `float`, `bool` or `torch.Size`, the compiled function gives exactly that
type, on the first call (the trace), on later calls, under `dynamic=True` and after a size
change under the automatic policy. `assert_same` compares types exactly."""

import dataclasses

import pytest
import torch
from harness import CountingBackend, assert_same

import kiln


def _sizes(fn, shapes, **compile_kwargs):
    compiled = kiln.compile(fn, backend=CountingBackend(), **compile_kwargs)
    for shape in shapes:
        x = torch.randn(*shape)
        assert_same(compiled(x), fn(x))
    return compiled


SHAPES = [(3, 4), (5, 4), (7, 4), (2, 4)]
PROGRAMS = {
    "dim": lambda x: x.shape[0] * 2 + 1,
    "float": lambda x: x.shape[0] / 2,
    "bool": lambda x: x.shape[0] > 4,
    "shape": lambda x: x.shape,
    "size": lambda x: x.size(),
    "slice": lambda x: x.shape[1:],
    "numel": lambda x: x.numel() // 2,
    "size_numel": lambda x: x.shape.numel(),
    "mixed": lambda x: (x.shape[0], x.sum(0), [x.size(0) - 1], {"n": x.shape[-2]}),
    "zeros": lambda x: torch.zeros(x.shape) + x,
    "view": lambda x: x.view(x.shape[0] * x.shape[1]),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("dynamic", [True, None])
def test_shape_values_are_plain(name, dynamic):
    _sizes(PROGRAMS[name], SHAPES, dynamic=dynamic)


def test_item_and_int_of_a_tensor():
    def fn(x):
        s = x.sum()
        return s.item(), int(s * 10), float(x.max()), x[0].item() > 0

    compiled = kiln.compile(fn, backend=CountingBackend())
    for _ in range(3):
        x = torch.randn(5)
        assert_same(compiled(x), fn(x))


class _Box:
    pass


BOX = _Box()
STORE: list = []
LAST = None


def _stores(x):
    global LAST
    BOX.n = x.shape[0] * 3
    BOX.size = x.shape
    STORE.append(x.shape[0] - 1)
    LAST = {"half": x.shape[0] / 2}
    return x + 1


@pytest.mark.parametrize("dynamic", [True, None])
def test_values_stored_outside_are_plain(dynamic):
    compiled = kiln.compile(_stores, backend=CountingBackend(), dynamic=dynamic)
    STORE.clear()
    for n in [3, 5, 6]:
        x = torch.randn(n, 2)
        assert_same(compiled(x), x + 1)
        assert type(BOX.n) is int and BOX.n == n * 3
        assert type(BOX.size) is torch.Size and BOX.size == (n, 2)
        assert [type(v) for v in STORE] == [int] * len(STORE)
        assert STORE[-1] == n - 1
        assert type(LAST["half"]) is float and LAST["half"] == n / 2


def test_value_passed_to_a_disabled_function_is_plain():
    seen = []

    @kiln.disable
    def record(n, size):
        seen.append((type(n), type(size)))
        return n

    def fn(x):
        return x * record(x.shape[0] + 1, x.shape)

    compiled = kiln.compile(fn, backend=CountingBackend(), dynamic=True)
    for n in [3, 4, 6]:
        x = torch.randn(n)
        assert_same(compiled(x), fn(x))
    assert set(seen) == {(int, torch.Size)}


def test_value_after_item_break_is_plain():
    def fn(x):
        k = x.sum().item()
        return k * 2, x + k

    compiled = kiln.compile(fn, backend=CountingBackend())
    for _ in range(3):
        x = torch.randn(4)
        assert_same(compiled(x), fn(x))


@dataclasses.dataclass(frozen=True)
class _Out:
    n: int
    t: torch.Tensor


class _Made:
    def __init__(self, n):
        self.n = n
        self.sizes = {n: [n - 1]}


def _objects(x):
    return _Out(x.shape[0] * 2, x + 1), _Made(x.shape[0]).__dict__, {x.shape[0]: {x.shape[-1]}}


@pytest.mark.parametrize("dynamic", [True, None])
def test_objects_and_keys_made_in_the_function_hold_plain_numbers(dynamic):
    _sizes(_objects, SHAPES, dynamic=dynamic)
    compiled = kiln.compile(
        lambda x: _Made(x.shape[0] + 1), backend=CountingBackend(), dynamic=dynamic
    )
    for n in [3, 5, 6]:
        made = compiled(torch.randn(n))
        assert type(made.n) is int and made.n == n + 1
        assert [type(k) for k in made.sizes] == [int] and type(made.sizes[n + 1][0]) is int
