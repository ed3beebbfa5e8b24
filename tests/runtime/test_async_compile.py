"""`options={"compile.async": True}` (runtime/async_compile.py): calls run eagerly while the
graph compiles in a background thread, then the compiled code is swapped in between calls.

Every test compares with eager PyTorch on fresh random data, in the phase where calls run
eagerly (the background compile held back by a gate) and in the compiled phase after the
swap; the swap is seen in `STATS` and in the autograd node a training output carries (kiln's
compiled forward records `CompiledFunctionBackward`, an eager forward ATen's own nodes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import kiln
from kiln.backends import builtin
from kiln.runtime import async_compile

ASYNC = {"compile.async": True}


@pytest.fixture
def gate(monkeypatch):
    """Holds every background compile at its start until `gate.set()`."""
    event = threading.Event()
    real = builtin._inductor

    def held(*args, **kwargs):
        assert event.wait(60), "the test never opened the gate"
        return real(*args, **kwargs)

    monkeypatch.setattr(builtin, "_inductor", held)
    kiln.reset()
    yield event
    event.set()
    async_compile.wait()
    kiln.reset()


def _stats():
    return dict(async_compile.STATS)


def _f(x, y):
    return torch.softmax(x * y.sin(), dim=-1) + (x - y).relu().exp()


def test_inference_runs_eagerly_then_swaps_to_compiled(gate):
    compiled = kiln.compile(_f, options=ASYNC)
    before = _stats()
    for _ in range(3):  # eager phase: the first call (capture's trace) and two eager calls
        x, y = torch.randn(16, 32), torch.randn(16, 32)
        torch.testing.assert_close(compiled(x, y), _f(x, y))
    assert _stats()["eager_calls"] - before["eager_calls"] == 2
    assert _stats()["swapped"] == before["swapped"]
    gate.set()
    assert async_compile.wait(60)
    for _ in range(2):
        x, y = torch.randn(16, 32), torch.randn(16, 32)
        torch.testing.assert_close(compiled(x, y), _f(x, y))
    after = _stats()
    assert after["swapped"] - before["swapped"] == 1
    assert after["eager_calls"] - before["eager_calls"] == 2
    assert after["failed"] == before["failed"]
    assert async_compile.active_threads() == 0


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(24, 48)
        self.b = torch.nn.Linear(48, 8)

    def forward(self, x):
        return (
            torch.nn.functional.gelu(self.a(x)).mul(1.5).sub(x.mean()).matmul(self.b.weight.t())
            + self.b.bias.tanh()
        )


def _step(model, x):
    model.zero_grad(set_to_none=True)
    out = model(x)
    loss = (out * out).sum()
    return out, loss


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def _compiled_node(out: torch.Tensor) -> bool:
    return "CompiledFunction" in type(out.grad_fn).__name__


def test_training_step_never_mixes_eager_and_compiled(gate):
    torch.manual_seed(0)
    model = _MLP()
    reference = _MLP()
    reference.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, options=ASYNC)

    def check(x, eager_expected: bool):
        out, loss = _step(compiled, x)
        ref_out, ref_loss = _step(reference, x)
        assert _compiled_node(out) is not eager_expected
        loss.backward()
        ref_loss.backward()
        torch.testing.assert_close(out, ref_out)
        for g, r in zip(_grads(model), _grads(reference)):
            torch.testing.assert_close(g, r)

    check(torch.randn(6, 24), eager_expected=True)  # the first call: capture's trace
    check(torch.randn(6, 24), eager_expected=True)  # compiling in the background
    # a step whose forward ran eagerly, with the compile finishing before its backward
    x = torch.randn(6, 24)
    out, loss = _step(compiled, x)
    ref_out, ref_loss = _step(reference, x)
    gate.set()
    assert async_compile.wait(120)
    assert not _compiled_node(out)
    loss.backward()
    ref_loss.backward()
    for g, r in zip(_grads(model), _grads(reference)):
        torch.testing.assert_close(g, r)
    before = _stats()["swapped"]
    check(torch.randn(6, 24), eager_expected=False)  # swapped in: compiled forward, backward
    check(torch.randn(6, 24), eager_expected=False)
    assert _stats()["swapped"] == before + 1


def test_a_failed_background_compile_falls_back_to_eager_with_the_reason(monkeypatch):
    kiln.reset()

    def broken(*args, **kwargs):
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(builtin, "_inductor", broken)
    before, recorded = _stats(), len(builtin.fallbacks())
    compiled = kiln.compile(_f, options=ASYNC)
    x, y = torch.randn(8, 40), torch.randn(8, 40)
    torch.testing.assert_close(compiled(x, y), _f(x, y))
    assert async_compile.wait(60)
    for _ in range(2):
        x, y = torch.randn(8, 40), torch.randn(8, 40)
        torch.testing.assert_close(compiled(x, y), _f(x, y))
    after = _stats()
    assert after["failed"] == before["failed"] + 1
    assert after["swapped"] == before["swapped"]  # never swapped: eager for good
    assert after["eager_calls"] == before["eager_calls"] + 2
    new = builtin.fallbacks()[recorded:]
    assert [(f.stage, f.reason) for f in new] == [
        ("async compile", "RuntimeError: broken on purpose")
    ]
    kiln.reset()


def test_code_generation_failure_in_the_background_is_the_usual_fallback(monkeypatch):
    import kiln.codegen

    kiln.reset()

    def broken(*args, **kwargs):
        raise ValueError("codegen broken on purpose")

    monkeypatch.setattr(kiln.codegen, "compile_graph", broken)
    recorded = len(builtin.fallbacks())
    compiled = kiln.compile(_f, options=ASYNC, fullgraph=True)
    x, y = torch.randn(8, 40), torch.randn(8, 40)
    torch.testing.assert_close(compiled(x, y), _f(x, y))
    assert async_compile.wait(60)
    x, y = torch.randn(8, 40), torch.randn(8, 40)
    torch.testing.assert_close(compiled(x, y), _f(x, y))
    reasons = [(f.stage, f.reason) for f in builtin.fallbacks()[recorded:]]
    assert reasons == [("code generation", "ValueError: codegen broken on purpose")]
    kiln.reset()


def test_recompiles_on_new_shapes_compile_in_the_background_too(gate):
    compiled = kiln.compile(_f, options=ASYNC, fullgraph=True, dynamic=False)
    before = _stats()
    shapes = [(4, 16), (5, 12)]
    for shape in shapes * 2:  # two entries (a guard fails on the new shape), eager phase
        x, y = torch.randn(shape), torch.randn(shape)
        torch.testing.assert_close(compiled(x, y), _f(x, y))
    assert _stats()["started"] - before["started"] == 2
    gate.set()
    assert async_compile.wait(120)
    for shape in shapes:
        x, y = torch.randn(shape), torch.randn(shape)
        torch.testing.assert_close(compiled(x, y), _f(x, y))
    assert _stats()["swapped"] - before["swapped"] == 2


def test_reset_drops_queued_compiles_and_waits_for_the_running_one(gate):
    def g(x):
        return (x * 3).cos() - x

    f1 = kiln.compile(_f, options=ASYNC)
    f2 = kiln.compile(g, options=ASYNC)
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    f1(x, y)  # starts compiling (held at the gate)
    f2(x)  # queued behind it
    before = _stats()
    threading.Timer(0.3, gate.set).start()
    kiln.reset()
    assert async_compile.active_threads() == 0
    assert _stats()["cancelled"] == before["cancelled"] + 1
    # both compile again (new entries), and stay right
    torch.testing.assert_close(f1(x, y), _f(x, y))
    torch.testing.assert_close(f2(x), g(x))
    assert _stats()["started"] == before["started"] + 2


def test_async_is_refused_by_backends_that_compile_nothing():
    with pytest.raises(ValueError, match="compile.async"):
        kiln.compile(_f, backend="aot_eager", options=ASYNC)


def test_no_compile_thread_is_left_at_exit(tmp_path):
    script = textwrap.dedent(
        """
        import atexit, threading, torch, kiln

        def report():  # registered before kiln's handler, so it runs after it
            names = [t.name for t in threading.enumerate() if t.name.startswith("kiln-async")]
            print("THREADS", names, flush=True)

        atexit.register(report)

        def f(x):
            return (x.sin() * 2).relu() + x

        x = torch.randn(64)
        out = kiln.compile(f, options={"compile.async": True})(x)
        torch.testing.assert_close(out, f(x))
        print("CALLED", flush=True)
        """
    )
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"))
    src = os.path.join(os.path.dirname(kiln.__file__), "..")
    env["PYTHONPATH"] = os.path.abspath(src) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CALLED" in proc.stdout
    assert "THREADS []" in proc.stdout, proc.stdout


def test_background_compile_sees_the_callers_autocast_and_grad_mode(gate):
    def h(x, w):
        return torch.nn.functional.linear(x, w).relu() * 2

    w = torch.randn(32, 16, requires_grad=True)
    compiled = kiln.compile(h, options=ASYNC)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        x = torch.randn(8, 16)
        torch.testing.assert_close(compiled(x, w), h(x, w))  # bfloat16, as eager's
        gate.set()
        assert async_compile.wait(60)
        before = _stats()["swapped"]
        x = torch.randn(8, 16)
        torch.testing.assert_close(compiled(x, w), h(x, w))
        assert _stats()["swapped"] == before + 1
