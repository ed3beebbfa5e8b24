"""Past `cache_size_limit`: the function runs natively, cheaply, and kiln says why once.

A function kiln gave up on must cost one test per call on top of eager: no guard checks of the
old entries, and no kiln interpreter for the rest of a call after a graph break (a continuation
has no native code; before the fix, every call past its limit ran in the interpreter, 35 times
slower than eager in benchmarks/dynamic_limit.py). Recompile reasons name the dimension that
changed with its old and new size.
"""

from __future__ import annotations

import math
import warnings

import torch
from harness import assert_same

import kiln
from kiln.capture import breaks


@kiln.disable
def _not_compiled() -> None:
    """A graph break where it is called."""


def pinned_after_a_break(x, cache):
    h = torch.relu(x)
    _not_compiled()  # the rest, which pins the cache length, is a continuation
    return h @ cache.transpose(0, 1) / math.sqrt(cache.shape[0])


def pinned(x, cache):
    return x @ cache.transpose(0, 1) / math.sqrt(cache.shape[0])


def _calls(fn, lengths, limit=3):
    compiled = kiln.compile(fn, backend="eager", options={"cache_size_limit": limit})
    x = torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for n in lengths:
            cache = torch.randn(n, 4)
            assert_same(compiled(x, cache), fn(x, cache))
    notes = [w for w in record if issubclass(w.category, kiln.KilnRecompileLimitWarning)]
    return compiled._kiln_compiled, notes


def test_a_continuation_past_its_limit_does_not_run_in_the_interpreter(monkeypatch):
    used = []
    real = breaks.concrete_interpreter
    monkeypatch.setattr(breaks, "concrete_interpreter", lambda cf: used.append(cf) or real(cf))
    cf, notes = _calls(pinned_after_a_break, range(2, 14))
    # the call that reached the limit finishes in the interpreter (it started compiled);
    # every later call runs the whole function natively
    assert len(used) == 1
    assert cf.native_only and "graph break" in cf.eager_reason
    assert len(notes) == 1 and "cache_size_limit" in str(notes[0].message)


def test_past_the_limit_no_entry_is_checked():
    cf, notes = _calls(pinned, range(2, 6))
    assert cf.native_only and len(cf.entries) == 3
    checked = []
    cf.entries[:] = [lambda *a, _e=e, **k: checked.append(1) or _e(*a, **k) for e in cf.entries]
    x = torch.randn(2, 4)
    for n in (2, 3, 9, 10):  # old lengths too: the function runs as written
        cache = torch.randn(n, 4)
        assert_same(cf(x, cache), pinned(x, cache))
    assert checked == []
    assert len(notes) == 1  # said once, however many calls follow


def test_the_limit_warning_names_the_dimension_and_both_sizes():
    _, notes = _calls(pinned, range(2, 6))
    text = str(notes[0].message)
    assert "L['cache']" in text and "dim 0 changed from 2 to 5" in text


def test_a_recompile_reason_names_the_pinned_size_and_its_value_now():
    compiled = kiln.compile(pinned, backend="eager")
    x = torch.randn(2, 4)
    for n in (3, 5):  # the second makes dim 0 dynamic; math.sqrt then pins it
        compiled(x, torch.randn(n, 4))
    cf = compiled._kiln_compiled
    why = cf._why_missed((x, torch.randn(7, 4)), {})
    assert "cache.size(0) == 5" in why and "now cache.size(0) is 7" in why
