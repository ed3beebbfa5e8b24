"""The public surface: kiln.compile's forms and errors, backends, reset, disable, fullgraph."""

import pytest
import torch
import torch.nn as nn
from harness import CountingBackend

import kiln
from kiln.capture.errors import Unsupported


def test_forms_plain_decorator_and_decorator_with_args():
    def f(x):
        return x.cos() + 1

    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(f)(x), f(x))

    @kiln.compile
    def g(x):
        return x.cos() + 1

    @kiln.compile(backend="eager", fullgraph=True)
    def h(x):
        return x.cos() + 1

    torch.testing.assert_close(g(x), f(x))
    torch.testing.assert_close(h(x), f(x))
    assert g.__name__ == "g"


def test_bound_method():
    class Obj:
        k = 3.0

        def run(self, x):
            return x * self.k

    o = Obj()
    backend = CountingBackend()
    m = kiln.compile(o.run, backend=backend)
    x = torch.randn(2)
    torch.testing.assert_close(m(x), x * 3.0)
    torch.testing.assert_close(m(x), x * 3.0)
    assert len(backend.graphs) == 1


def test_module_wrapper_shares_state():
    mod = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    cm = kiln.compile(mod)
    assert isinstance(cm, nn.Module)
    assert list(cm.state_dict().keys()) == list(mod.state_dict().keys())
    assert [p is q for p, q in zip(cm.parameters(), mod.parameters())] == [True] * 4
    cm.eval()
    assert not mod.training and not mod[1].training and not cm.training
    cm.train()
    assert mod.training and mod[1].training
    sd = {
        k: torch.randn_like(v) if v.is_floating_point() else v for k, v in mod.state_dict().items()
    }
    cm.load_state_dict(sd)
    torch.testing.assert_close(mod[0].weight, sd["0.weight"])


def test_unknown_backend_mode_option_and_non_callable():
    with pytest.raises(ValueError, match="unknown backend 'eagre'.*Did you mean 'eager'"):
        kiln.compile(lambda x: x, backend="eagre")
    with pytest.raises(ValueError, match="unknown mode 'fast'.*Valid modes"):
        kiln.compile(lambda x: x, mode="fast")
    with pytest.raises(ValueError, match="unknown option 'max_autotun'.*Known options"):
        kiln.compile(lambda x: x, options={"max_autotun": True})
    with pytest.raises(TypeError, match="expected a function, method or nn.Module"):
        kiln.compile(42)
    with pytest.raises(ValueError, match="mode='reduce-overhead' sets triton.cudagraphs=True"):
        kiln.compile(lambda x: x, mode="reduce-overhead", options={"triton.cudagraphs": False})
    with pytest.raises(TypeError, match="takes bool"):
        kiln.compile(lambda x: x, options={"trace.enabled": "yes"})


def test_async_is_refused():
    async def f(x):
        return x

    with pytest.raises(TypeError, match="async"):
        kiln.compile(f)


def test_list_and_register_backends():
    assert {"eager", "aot_eager", "inductor"} <= set(kiln.list_backends())

    calls = []

    @kiln.register_backend(name="kiln_test_counting")
    def counting(gm, example_inputs):
        calls.append(gm)
        return gm.forward

    f = kiln.compile(lambda x: x * 2, backend="kiln_test_counting")
    torch.testing.assert_close(f(torch.ones(2)), torch.full((2,), 2.0))
    assert len(calls) == 1
    with pytest.raises(ValueError, match="already registered"):
        kiln.register_backend(counting, name="kiln_test_counting")


def test_reset_recompiles():
    backend = CountingBackend()
    f = kiln.compile(lambda x: x + 1, backend=backend)
    f(torch.randn(2))
    kiln.reset()
    f(torch.randn(2))
    assert len(backend.graphs) == 2


def test_disable_returns_model_and_disabled_function_breaks():
    def f(x):
        return x * 2

    assert kiln.compile(f, disable=True) is f

    @kiln.disable
    def helper(x):
        return x + 1

    backend = CountingBackend()
    g = kiln.compile(lambda x: helper(x) * 3, backend=backend)
    x = torch.randn(3)
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(g(x), (x + 1) * 3)
    state = g._kiln_compiled
    assert state.eager_reason is None
    assert any("kiln.disable" in reason for reason, _, _ in state.breaks)
    assert len(backend.graphs) == 1  # nothing before the break; `* 3` after it


def test_a_freed_disabled_function_does_not_pass_its_mark_on():
    """kiln.disable marked functions by id; once a marked function was freed, a new function
    allocated at its address (CPython reuses it at once) was treated as disabled too: a
    graph break where there is none (it made test_breaks flaky)."""
    import gc

    def make():
        def helper(y):
            return y * 2

        return helper

    kiln.disable(make())  # marked, and no reference kept here
    gc.collect()
    others = [make() for _ in range(64)]  # one of these would take the freed address
    for helper in others:
        backend = CountingBackend()
        g = kiln.compile(lambda x, h=helper: h(x + 1).exp(), backend=backend)
        x = torch.rand(3)
        torch.testing.assert_close(g(x), ((x + 1) * 2).exp())
        assert not g._kiln_compiled.breaks
        assert len(backend.graphs) == 1


def test_is_compiling():
    seen = []

    def f(x):
        seen.append(kiln.is_compiling())
        return x + 1

    kiln.compile(f, backend="eager")(torch.randn(1))
    assert seen == [True] and not kiln.is_compiling()


def test_fullgraph_error_names_line_reason_and_hint():
    def f(x):
        y = x * 2
        if y.sum() > 0:  # data-dependent branch
            return y
        return -y

    cf = kiln.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(Unsupported) as err:
        cf(torch.ones(3))
    msg = str(err.value)
    assert "test_api.py" in msg and "if y.sum() > 0" in msg
    assert "Tensor.__bool__" in msg and "hint:" in msg


def test_graph_break_splits_the_graph_with_correct_results():
    def f(x):
        if x.sum() > 0:
            return x * 2
        return x - 1

    backend = CountingBackend()
    cf = kiln.compile(f, backend=backend)
    for sign in (1, -1, 1, -1):
        x = torch.rand(4) * sign
        torch.testing.assert_close(cf(x), f(x))
    state = cf._kiln_compiled
    assert state.eager_reason is None
    assert any("Tensor.__bool__" in reason for reason, _, _ in state.breaks)
    assert len(backend.graphs) == 3  # sum; then one graph per side of the branch


def test_unknown_c_function_breaks_and_stays_correct():
    import random

    def f(x):
        return x * random.random()

    cf = kiln.compile(f, backend="eager")
    for seed in (0, 1, 2):
        random.seed(seed)
        a = cf(torch.ones(2))
        random.seed(seed)
        torch.testing.assert_close(a, f(torch.ones(2)))
    assert any("random" in reason for reason, _, _ in cf._kiln_compiled.breaks)


def test_inductor_runs_and_matches():
    mod = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    cm = kiln.compile(mod)
    x = torch.randn(3, 4)
    torch.testing.assert_close(cm(x), mod(x))
    torch.testing.assert_close(cm(x), mod(x))


def test_torch_compile_interop_entry_point():
    from kiln.backends.interop import kiln_backend

    f = torch.compile(lambda x: x.sin() * 2, backend=kiln_backend)
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x.sin() * 2)


def test_graph_code_is_written_on_first_use_and_called_directly_after():
    """The graph module writes its Python code when a later call first runs it (the traced
    call never needs it); from then on the entry calls the generated forward directly."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    def f(x, y):
        return torch.relu(x) * y + 1

    cf = kiln.compile(f, backend=backend)
    for _ in range(3):
        x, y = torch.randn(5), torch.randn(5)
        torch.testing.assert_close(cf(x, y), f(x, y))
    (gm,) = seen
    assert "relu" in gm.code
    entry = cf._kiln_compiled.entries[0]
    bound = entry.__globals__["___graph"]
    assert bound.__func__ is type(gm).forward, bound
