"""Values a trace reads from outside its arguments' tensors must be guarded: environment
variables, attributes set on tensors (and their absence), whether an input is an inference
tensor, and what a functools.partial binds. Each test changes the value between calls and
compares with eager."""

import functools
import os

import pytest
import torch
from harness import CountingBackend, assert_same

import kiln

VAR = "KILN_TEST_SOUNDNESS_VAR"


@pytest.fixture
def env_var():
    saved = os.environ.pop(VAR, None)
    yield
    os.environ.pop(VAR, None)
    if saved is not None:
        os.environ[VAR] = saved


def _by_get(x):
    return x + 1 if os.environ.get(VAR) == "1" else x - 1


def _by_in(x):
    return x * 2 if VAR in os.environ else x * 3


def _by_getenv(x):
    return x * float(os.getenv(VAR, "0.5"))


def _by_item(x):
    try:
        return x * float(os.environ[VAR])
    except KeyError:
        return -x


def _by_scan(x):
    return x * len([k for k in os.environ if k.startswith(VAR)])


@pytest.mark.parametrize("fn", [_by_get, _by_in, _by_getenv, _by_item, _by_scan])
def test_environment_variable_changes_between_calls(env_var, fn):
    compiled = kiln.compile(fn, backend=CountingBackend())
    for value in [None, "1", "2.5", None, "1"]:
        if value is None:
            os.environ.pop(VAR, None)
        else:
            os.environ[VAR] = value
        x = torch.randn(4)
        assert_same(compiled(x), fn(x))


def test_environment_write_is_replayed_by_running_it(env_var):
    def fn(x):
        os.environ[VAR] = str(int(os.environ.get(VAR, "0")) + 1)
        return x + 1

    compiled = kiln.compile(fn, backend=CountingBackend())
    for _ in range(3):
        x = torch.randn(3)
        assert_same(compiled(x), x + 1)
    assert os.environ[VAR] == "3"


def _tagged(x):
    return x + 1 if hasattr(x, "tag") else x - 1


def _scaled(x):
    return x * x.scale


def _getattr_default(x):
    return x * getattr(x, "scale", 10.0)


def test_hasattr_on_a_tensor_input():
    compiled = kiln.compile(_tagged, backend=CountingBackend())
    x = torch.randn(3)
    assert_same(compiled(x), _tagged(x))
    x.tag = "set"
    assert_same(compiled(x), _tagged(x))
    y = torch.randn(3)
    assert_same(compiled(y), _tagged(y))
    del x.tag
    assert_same(compiled(x), _tagged(x))


@pytest.mark.parametrize("fn", [_scaled, _getattr_default])
def test_attribute_set_on_a_tensor_changes(fn):
    compiled = kiln.compile(fn, backend=CountingBackend())
    x = torch.randn(3)
    x.scale = 2.0
    assert_same(compiled(x), fn(x))
    x.scale = -3.0
    assert_same(compiled(x), fn(x))
    y = torch.randn(3)
    y.scale = 0.5
    assert_same(compiled(y), fn(y))
    if fn is _getattr_default:
        z = torch.randn(3)
        assert_same(compiled(z), fn(z))


def _inference_aware(x):
    return x + 1 if x.is_inference() else x * 2


def _view_aware(x, y):
    v = y.view(-1)
    return x - 1 if v.is_inference() else x + y


def _unaware(x, y):
    return (x * y).sum(0), x.view(-1)


def _tensor(inference: bool):
    if inference:
        with torch.inference_mode():
            return torch.randn(3)
    return torch.randn(3)


@pytest.mark.parametrize("fn", [_inference_aware, _view_aware, _unaware], ids=lambda f: f.__name__)
def test_inference_tensor_input_is_told_apart(fn):
    compiled = kiln.compile(fn, backend=CountingBackend())
    nargs = fn.__code__.co_argcount
    for inference in [False, True, False, True]:
        args = (
            (torch.randn(3), _tensor(inference))[-nargs:] if nargs == 2 else (_tensor(inference),)
        )
        got, expected = compiled(*args), fn(*args)
        assert_same(got, expected)
        for g, e in zip(
            got if isinstance(got, tuple) else (got,),
            expected if isinstance(expected, tuple) else (expected,),
        ):
            assert g.is_inference() == e.is_inference()


def _mul(x, k, bias=0.0):
    return x * k + bias


PARTIAL = functools.partial(_mul, k=2.0)


def _global_partial(x):
    return PARTIAL(x)


def test_global_partial_rebound_and_mutated():
    global PARTIAL
    saved = PARTIAL
    compiled = kiln.compile(_global_partial, backend=CountingBackend())
    try:
        for make in [
            lambda: functools.partial(_mul, k=2.0),
            lambda: functools.partial(_mul, k=3.0),
            lambda: functools.partial(_mul, k=3.0, bias=1.0),
            lambda: functools.partial(torch.mul, other=4.0),
        ]:
            PARTIAL = make()
            x = torch.randn(3)
            assert_same(compiled(x), _global_partial(x))
        PARTIAL.keywords["other"] = -1.0
        x = torch.randn(3)
        assert_same(compiled(x), _global_partial(x))
    finally:
        PARTIAL = saved


def test_partial_argument_bound_values():
    def fn(p, x):
        return p(x)

    compiled = kiln.compile(fn, backend=CountingBackend())
    for p in [
        functools.partial(_mul, k=2.0),
        functools.partial(_mul, k=5.0),
        functools.partial(_mul, k=5.0, bias=-2.0),
        functools.partial(torch.mul, other=2.0),
        functools.partial(torch.mul, other=3.0),
    ]:
        x = torch.randn(3)
        assert_same(compiled(p, x), fn(p, x))


def _rmul(k, x):
    return x * k


def test_partial_positional_args():
    def fn(p, x):
        return p(x)

    compiled = kiln.compile(fn, backend=CountingBackend())
    for k in [2.0, 3.0, -1.0]:
        p = functools.partial(_rmul, k)
        x = torch.randn(3)
        assert_same(compiled(p, x), fn(p, x))
