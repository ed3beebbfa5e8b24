"""Shared checks for capture tests: compile with a graph-counting backend, compare with eager.

Every check runs the program several times on fresh random inputs (never zeros), compares the
outputs and every argument afterwards (mutated inputs) with an eager run on identical copies,
counts the graphs the backend received, and asserts that the compiled entry (not an eager
fallback) served the later calls.
"""

from __future__ import annotations

import copy
import dataclasses
import logging

import torch

import kiln


class CountingBackend:
    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.runs = 0

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)

        def run(*args):
            self.runs += 1
            return gm(*args)

        return run


def assert_same(got, expected, path="out"):
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: expected a tensor, got {type(got)}"
        assert got.shape == expected.shape, f"{path}: shape {got.shape} != {expected.shape}"
        assert got.dtype == expected.dtype, f"{path}: dtype {got.dtype} != {expected.dtype}"
        assert got.requires_grad == expected.requires_grad, f"{path}: requires_grad differs"
        torch.testing.assert_close(got, expected, msg=lambda m: f"{path}: {m}")
        return
    assert type(got) is type(expected), f"{path}: type {type(got)} != {type(expected)}"
    if isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), f"{path}: length {len(got)} != {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same(g, e, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert list(got.keys()) == list(expected.keys()), f"{path}: keys differ"
        for k in expected:
            assert_same(got[k], expected[k], f"{path}[{k!r}]")
    elif dataclasses.is_dataclass(expected):
        for f in dataclasses.fields(expected):
            assert_same(getattr(got, f.name), getattr(expected, f.name), f"{path}.{f.name}")
    elif isinstance(expected, torch.nn.Module):
        assert_same(got.state_dict(), expected.state_dict(), f"{path}.state_dict()")
    else:
        assert got == expected, f"{path}: {got!r} != {expected!r}"


def clone(value):
    """Independent copies of args (tensors cloned, containers rebuilt, modules deep-copied)."""
    if isinstance(value, torch.Tensor):
        c = value.detach().clone()
        return c.requires_grad_(value.requires_grad)
    if isinstance(value, torch.nn.Module):
        return copy.deepcopy(value)
    if isinstance(value, list):
        return [clone(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(clone(v) for v in value)
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    return copy.copy(value) if dataclasses.is_dataclass(value) else value


def check(fn, make_args, *, graphs=1, calls=3, kwargs_fn=None, **compile_kwargs):
    """Compile `fn`, run it `calls` times on `make_args()` and compare with eager."""
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend, **compile_kwargs)
    for _ in range(calls):
        args = make_args()
        kwargs = kwargs_fn() if kwargs_fn else {}
        eager_args, eager_kwargs = clone(args), clone(kwargs)
        expected = fn(*eager_args, **eager_kwargs)
        got = compiled(*args, **kwargs)
        assert_same(got, expected)
        assert_same(args, eager_args, "args after the call")
        assert_same(kwargs, eager_kwargs, "kwargs after the call")
    assert len(backend.graphs) == graphs, f"expected {graphs} graph(s), got {len(backend.graphs)}"
    state = compiled._kiln_compiled
    assert state.eager_reason is None, f"fell back to eager: {state.eager_reason}"
    if graphs:
        assert backend.runs >= calls - graphs, "the compiled graph did not serve later calls"
    return compiled, backend


def check_module(make_module, make_args, *, graphs=1, calls=3, train=None, **compile_kwargs):
    """Compile a module; compare outputs and module state with an eager twin every call."""
    torch.manual_seed(0)
    eager_mod = make_module()
    mod = copy.deepcopy(eager_mod)
    if train is not None:
        eager_mod.train(train)
        mod.train(train)
    backend = CountingBackend()
    compiled = kiln.compile(mod, backend=backend, **compile_kwargs)
    for _ in range(calls):
        args = make_args()
        eager_args = clone(args)
        expected = eager_mod(*eager_args)
        got = compiled(*args)
        assert_same(got, expected)
        assert_same(args, eager_args, "args after the call")
        assert_same(mod.state_dict(), eager_mod.state_dict(), "module state")
    assert len(backend.graphs) == graphs, f"expected {graphs} graph(s), got {len(backend.graphs)}"
    assert compiled._kiln_compiled.eager_reason is None, compiled._kiln_compiled.eager_reason
    if graphs:
        assert backend.runs >= calls - graphs, "the compiled graph did not serve later calls"
    return compiled, backend


def randn(*shape, **kw):
    return lambda: (torch.randn(*shape, **kw),)


def randn2(*shape):
    return lambda: (torch.randn(*shape), torch.randn(*shape))


class CollectLogs(logging.Handler):
    """Collects one kiln log's messages, whatever other tests did to logging's settings."""

    def __init__(self, name: str):
        super().__init__(level=logging.DEBUG)
        self.logger = logging.getLogger(name)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        self.old_level = self.logger.level
        self.logger.addHandler(self)
        self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        self.logger.setLevel(self.old_level)
