"""Soundness of kiln's own API surface: a compiled callable's own signature never takes a
user's keyword, and a compiled container module answers `len`/`bool`/iteration/indexing as the
original does."""

import pytest
import torch
from harness import CountingBackend, assert_same

import kiln


def _scaled(self, other=None):
    return self * 2 if other is None else self * other


@pytest.mark.parametrize("how", ["keyword", "dict"])
def test_keyword_named_self_reaches_the_function(how):
    compiled = kiln.compile(_scaled, backend=CountingBackend())
    for _ in range(3):
        x, y = torch.randn(4), torch.randn(4)
        if how == "keyword":
            got = compiled(self=x, other=y)
        else:
            got = compiled(**{"self": x, "other": y})
        assert_same(got, _scaled(x, y))


def test_any_keyword_name_passes_through_var_kwargs():
    def fn(**kw):
        return kw["self"] * kw["args"] + kw["kwargs"]

    compiled = kiln.compile(fn, backend=CountingBackend())
    for _ in range(3):
        kw = {"self": torch.randn(3), "args": torch.randn(3), "kwargs": torch.randn(3)}
        assert_same(compiled(**kw), fn(**kw))


def _containers():
    return [
        torch.nn.ModuleList(),
        torch.nn.ModuleList([torch.nn.Linear(3, 3), torch.nn.ReLU()]),
        torch.nn.Sequential(),
        torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh()),
        torch.nn.ModuleDict(),
        torch.nn.ModuleDict({"a": torch.nn.Linear(3, 3), "b": torch.nn.ReLU()}),
    ]


@pytest.mark.parametrize("index", range(6))
def test_container_module_protocol_matches_the_original(index):
    mod = _containers()[index]
    compiled = kiln.compile(mod, backend=CountingBackend())
    assert bool(compiled) == bool(mod)
    assert len(compiled) == len(mod)
    assert list(iter(compiled)) == list(iter(mod))
    for key in list(iter(mod)):
        if isinstance(mod, torch.nn.ModuleDict):
            assert key in compiled
            assert compiled[key] is mod[key]
        else:
            assert key in compiled
    if not isinstance(mod, torch.nn.ModuleDict) and len(mod):
        assert compiled[0] is mod[0]
        assert compiled[-1] is mod[-1]
    if isinstance(mod, torch.nn.ModuleDict):
        assert "missing" not in compiled


def test_sequential_still_runs_and_a_plain_module_has_no_len():
    mod = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    compiled = kiln.compile(mod, backend=CountingBackend())
    for _ in range(2):
        x = torch.randn(2, 3)
        assert_same(compiled(x), mod(x))
    lin = torch.nn.Linear(2, 2)
    compiled_lin = kiln.compile(lin, backend=CountingBackend())
    assert bool(compiled_lin) is True
    with pytest.raises(TypeError):
        len(compiled_lin)
