"""Programs the differential fuzzer (tests/fuzz/) found kiln getting wrong, reduced to the
mechanism: each compares compiled with eager over several calls on fresh random inputs."""

from __future__ import annotations

import pytest
import torch
from harness import assert_same, clone

import kiln


def _compare(fn, make_args, calls=3, backend="eager", between=None):
    compiled = kiln.compile(fn, backend=backend)
    for i in range(calls):
        if between is not None:
            between(i)
        args = make_args()
        eager_args = clone(args)
        expected = fn(*eager_args)
        got = compiled(*args)
        assert_same(got, expected)
        assert_same(args, eager_args, "args after the call")
    return compiled


def _own_cell_read(x, flag):
    if flag:
        t = x * 2
    y = t + 1  # read in the frame that owns the cell

    def f():
        return t * 3

    return y, f()


def _enclosing_cell_read(x, flag):
    if flag:
        t = x * 2

    def f():
        return t * 3  # read in the nested function

    return f()


@pytest.mark.parametrize("prog", [_own_cell_read, _enclosing_cell_read])
def test_empty_cell_raises_what_cpython_raises(prog):
    """An empty cell read in the frame that owns it (a local that a nested function captures)
    is an UnboundLocalError, read from a nested function a NameError: type and message as
    CPython's."""
    compiled = kiln.compile(prog, backend="eager")
    x = torch.randn(3)
    assert_same(compiled(x, True), prog(x, True))
    with pytest.raises(Exception) as eager:
        prog(x, False)
    with pytest.raises(Exception) as got:
        compiled(x, False)
    assert type(got.value) is type(eager.value)
    assert str(got.value) == str(eager.value)


def test_item_live_across_a_second_break():
    """A `.item()` value (symbolic in the continuation after the break that made it) still
    live at a second break: the second continuation gets the plain number."""

    def f(x):
        s = (x + 1).mean().item()
        y = x * 2 if x.sum() > 0 else x - 1
        return y * s, s

    def args():
        return (torch.randn(4, 3) + torch.randn(()).item(),)

    _compare(f, args, calls=6)


def test_item_escaping_result_and_outside_state_is_plain():
    """A `.item()` value returned or stored into outside containers, attributes and cells
    reaches the caller as the float eager gives, not kiln's symbolic number."""
    store = {"d": {}, "l": []}

    class Obj:
        pass

    obj = Obj()

    def f(x):
        s = x.sum().item()
        t = x.abs().max().item() + 1
        store["d"]["s"] = s
        store["l"].append(t * 2)
        obj.v = (s, t)
        return x * s, s, t, [t]

    compiled = kiln.compile(f, backend="eager")
    for _ in range(4):
        x = torch.randn(3, 2)
        got = compiled(x)
        assert_same(got, f(x.clone()))
        for value in (*got[1:3], got[3][0], store["d"]["s"], store["l"][-1], *obj.v):
            assert type(value) is float, type(value)
