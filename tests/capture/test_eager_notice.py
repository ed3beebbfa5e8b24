"""A compiled function that runs eagerly says so once, as a Python warning naming the function,
the reason, the user's file, line and source text and a hint; fullgraph=True raises instead.

The programs here hit each path on which a frame (or the rest of one) goes eager: an opcode
the interpreter does not implement (made so with a stand-in: kiln implements more opcodes
over time), a graph break that cannot resume, and the entry limit (cache_size_limit).
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from harness import assert_same

import kiln
from kiln.capture import bytecode
from kiln.capture.errors import Unsupported


@pytest.fixture(autouse=True)
def fresh_notices():
    kiln.reset()  # each test may warn again about code another test compiled
    yield
    kiln.reset()


@pytest.fixture
def no_build_set(monkeypatch):
    """BUILD_SET (`{a, b}`) as if the interpreter did not implement it."""
    monkeypatch.setitem(bytecode._HANDLERS, "BUILD_SET", bytecode._unknown)
    bytecode._cache.clear()
    yield
    bytecode._cache.clear()


def uses_a_set_display(x):
    y = x * 2
    sizes = {y.dim(), 7}  # THE UNKNOWN OPCODE
    return y * len(sizes)


def _line_of(fn, marker: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, text in enumerate(lines) if marker in text)


def _eager_warnings(record) -> list:
    return [w for w in record if issubclass(w.category, kiln.KilnEagerWarning)]


def test_unknown_opcode_warns_once_with_the_users_line(no_build_set):
    compiled = kiln.compile(uses_a_set_display, backend="eager")
    again = kiln.compile(uses_a_set_display, backend="eager")  # the same code object
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            x = torch.randn(3, 2)
            assert_same(compiled(x), uses_a_set_display(x.clone()))
            assert_same(again(x), uses_a_set_display(x.clone()))
    notes = _eager_warnings(record)
    assert len(notes) == 1, [str(w.message) for w in notes]
    w = notes[0]
    text = str(w.message)
    line = _line_of(uses_a_set_display, "THE UNKNOWN OPCODE")
    assert w.filename == __file__ and w.lineno == line
    assert "uses_a_set_display runs eagerly" in text and "BUILD_SET" in text
    assert f"{__file__}:{line} in uses_a_set_display" in text
    assert "sizes = {y.dim(), 7}" in text and "hint:" in text and "warn_eager" in text


def test_unknown_opcode_under_fullgraph_raises(no_build_set):
    compiled = kiln.compile(uses_a_set_display, backend="eager", fullgraph=True)
    with pytest.raises(Unsupported) as info:
        compiled(torch.randn(3))
    text = str(info.value)
    line = _line_of(uses_a_set_display, "THE UNKNOWN OPCODE")
    assert "fullgraph=True" in text and "BUILD_SET" in text
    assert f"{__file__}:{line} in uses_a_set_display" in text


@pytest.mark.parametrize("how", ["option", "env", "filter"])
def test_the_warning_can_be_silenced(no_build_set, monkeypatch, how):
    opts = None
    if how == "option":
        opts = {"warn_eager": False}
    elif how == "env":
        monkeypatch.setenv("KILN_WARN_EAGER", "0")
    compiled = kiln.compile(uses_a_set_display, backend="eager", options=opts)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        if how == "filter":
            warnings.filterwarnings("ignore", category=kiln.KilnEagerWarning)
        x = torch.randn(4)
        assert_same(compiled(x), uses_a_set_display(x.clone()))
    assert not _eager_warnings(record)
    assert "BUILD_SET" in compiled._kiln_compiled.eager_reason


def breaks_in_a_nested_function(x):
    def inner(t):
        return t * float(t.sum())  # THE BREAK

    return inner(x + 1) - 2


def test_a_break_that_cannot_resume_warns_once():
    compiled = kiln.compile(breaks_in_a_nested_function, backend="eager")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            x = torch.randn(5)
            assert_same(compiled(x), breaks_in_a_nested_function(x.clone()))
    notes = _eager_warnings(record)
    assert len(notes) == 1, [str(w.message) for w in notes]
    text = str(notes[0].message)
    line = _line_of(breaks_in_a_nested_function, "THE BREAK")
    assert notes[0].lineno == line and "graph break" in text
    assert "return t * float(t.sum())" in text


def test_a_break_that_cannot_resume_under_fullgraph_raises():
    compiled = kiln.compile(breaks_in_a_nested_function, backend="eager", fullgraph=True)
    with pytest.raises(Unsupported, match="fullgraph=True"):
        compiled(torch.randn(5))


def test_cache_size_limit_warns_once_naming_the_guard():
    def scale(x, n):
        return x * n

    compiled = kiln.compile(scale, backend="eager", options={"cache_size_limit": 2})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for n in range(6):
            x = torch.randn(3)
            assert_same(compiled(x, n), scale(x, n))
    notes = [w for w in record if issubclass(w.category, kiln.KilnRecompileLimitWarning)]
    assert len(notes) == 1
    text = str(notes[0].message)
    assert "cache_size_limit" in text and "L['n']" in text and "now 2" in text


def test_cache_size_limit_under_fullgraph_raises():
    compiled = kiln.compile(
        lambda x, n: x * n, backend="eager", fullgraph=True, options={"cache_size_limit": 2}
    )
    x = torch.randn(3)
    compiled(x, 0)
    compiled(x, 1)
    with pytest.raises(Unsupported, match="cache_size_limit.*L\\['n'\\]"):
        compiled(x, 2)
