"""Automatic garbage collection is off while kiln compiles and as the user left it otherwise
(kiln/gc_pause.py)."""

import gc

import pytest
import torch

import kiln
from kiln.autograd import aot_compile
from kiln.capture.tracer import Tracer
from kiln.gc_pause import paused_gc


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_inside_and_restored_after_even_on_error(collector_on):
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), paused_gc():
        raise ValueError("compile failed")
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off(collector_on):
    gc.disable()
    with paused_gc():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_capture_and_backend_compile_run_paused_and_user_code_after_a_break_does_not(
    collector_on, monkeypatch
):
    seen = {}
    track = Tracer.track  # each trace, the function's and its continuation's, tracks its inputs

    def tracking(self, *args, **kwargs):
        seen.setdefault("trace", []).append(gc.isenabled())
        return track(self, *args, **kwargs)

    monkeypatch.setattr(Tracer, "track", tracking)

    def backend(gm, example_inputs):
        seen.setdefault("backend", []).append(gc.isenabled())
        return gm.forward

    def after_break(x):
        seen.setdefault("eager", []).append(gc.isenabled())
        return x

    def fn(x):
        y = torch.sin(x) * 2
        y = kiln.disable(after_break)(y)  # a graph break: runs eagerly between two graphs
        return torch.cos(y) + 1

    x = torch.randn(5, 3)
    out = kiln.compile(fn, backend=backend)(x)
    torch.testing.assert_close(out, torch.cos(torch.sin(x) * 2) + 1)
    assert seen["backend"] == [False, False]  # the graphs before and after the break
    assert seen["trace"] and not any(seen["trace"])
    assert seen["eager"] == [True]
    assert gc.isenabled()


def test_a_new_aot_entry_compiles_paused(collector_on):
    seen = []

    def compiler(gm, example_inputs):
        seen.append(gc.isenabled())
        return gm.forward

    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) * 3)
    x = torch.randn(4, requires_grad=True)
    compiled = aot_compile(gm, [x], fw_compiler=compiler, bw_compiler=compiler)
    with torch.no_grad():  # another grad mode: a second entry, compiled on this call
        out = compiled(x)
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, x.relu() * 3)
    assert len(seen) == 3 and not any(seen)  # backward, forward, then the no-grad entry
    assert gc.isenabled()
