"""Fallbacks of the built-in backends (backends/builtin.py): when kiln's code generator raises or
declines a graph, or AOT autograd refuses one, the graph still runs (on eager kernels) and
matches eager on fresh random inputs, the log says why once, and the process-wide record
(`builtin.fallbacks()`) names the graph, the stage and the reason.
"""

from __future__ import annotations

import pytest
import torch

import kiln
import kiln.autograd
import kiln.codegen
import kiln.codegen.pipeline
from kiln import logs
from kiln.backends import builtin
from kiln.lower import GraphUnsupported


def _model(x, w):
    return torch.tanh(x @ w) * 2.0 + x.sum(dim=1, keepdim=True)


def _inputs(requires_grad: bool = False):
    x = torch.randn(8, 16)
    w = torch.randn(16, 16, requires_grad=requires_grad)
    return x, w


def _new_fallbacks(before: int) -> list:
    return builtin.fallbacks()[before:]


def _compile_and_check(fn, requires_grad: bool = False):
    """Compile `fn` with the inductor backend and compare with eager on three fresh inputs."""
    kiln.reset()
    compiled = kiln.compile(fn)
    for _ in range(3):
        x, w = _inputs(requires_grad)
        got = compiled(x, w)
        w_ref = w.detach().clone().requires_grad_(requires_grad)
        expected = fn(x, w_ref)
        torch.testing.assert_close(got, expected)
        if requires_grad:
            grad = torch.randn_like(expected)
            got.backward(grad)
            expected.backward(grad)
            torch.testing.assert_close(w.grad, w_ref.grad)


def test_a_graph_kiln_compiles_is_no_fallback():
    before = len(builtin.fallbacks())
    _compile_and_check(_model)
    assert _new_fallbacks(before) == []


@pytest.mark.parametrize("requires_grad", [False, True], ids=["inference", "training"])
def test_code_generator_raising_is_recorded_and_still_correct(
    monkeypatch, perf_hints, requires_grad
):
    def broken(*args, **kwargs):
        raise NotImplementedError("no lowering, for this test")

    monkeypatch.setattr(kiln.codegen, "compile_graph", broken)
    before = len(builtin.fallbacks())
    _compile_and_check(_model, requires_grad)
    got = _new_fallbacks(before)
    assert len(got) == (2 if requires_grad else 1)  # the forward graph, and the backward's
    assert {(f.graph, f.stage) for f in got} == {("_model", "code generation")}
    assert all(f.reason == "NotImplementedError: no lowering, for this test" for f in got)
    said = [m for m in perf_hints if "code generation failed" in m]
    assert len(said) == len(got)  # logged once a graph, not once a call
    assert "_model: code generation: NotImplementedError" in str(got[0])


def test_code_generator_declining_is_recorded_with_its_reason(monkeypatch, perf_hints):
    def unsupported(*args, **kwargs):
        raise GraphUnsupported("symbolic sizes, for this test")

    monkeypatch.setattr(kiln.codegen.pipeline, "lower_graph", unsupported)
    before = len(builtin.fallbacks())
    _compile_and_check(_model)
    (got,) = _new_fallbacks(before)
    assert (got.graph, got.stage) == ("_model", "code generation")
    assert got.reason == "declined for cpu: symbolic sizes, for this test"
    assert any("symbolic sizes, for this test" in m for m in perf_hints)


def test_declining_is_recorded_with_its_reason_with_logs_off(monkeypatch):
    # the reason travels in the code generator's answer (Declined), not in log text
    def unsupported(*args, **kwargs):
        raise GraphUnsupported("symbolic sizes, for this test")

    monkeypatch.setattr(kiln.codegen.pipeline, "lower_graph", unsupported)
    monkeypatch.setattr(logs, "_enabled", set())
    before = len(builtin.fallbacks())
    _compile_and_check(_model)
    (got,) = _new_fallbacks(before)
    assert got.reason == "declined for cpu: symbolic sizes, for this test"


@pytest.mark.parametrize("backend", ["inductor", "cudagraphs"])
def test_aot_autograd_refusing_is_recorded_and_runs_the_captured_graph(
    monkeypatch, perf_hints, backend
):
    from kiln.autograd.errors import AotUnsupported

    def refuse(*args, **kwargs):
        raise AotUnsupported("a data-dependent output, for this test", "none needed")

    monkeypatch.setattr(kiln.autograd, "aot_compile", refuse)
    before = len(builtin.fallbacks())
    kiln.reset()
    compiled = kiln.compile(_model, backend=backend)
    x, w = _inputs()
    torch.testing.assert_close(compiled(x, w), _model(x, w))
    (got,) = _new_fallbacks(before)
    assert (got.graph, got.stage) == ("_model", "AOT autograd")
    assert "a data-dependent output, for this test" in got.reason
    (said,) = [m for m in perf_hints if "AOT autograd could not take this graph" in m]
    assert said.startswith(f"{backend}: ")
    assert said.endswith("without device graphs") == (backend == "cudagraphs")
