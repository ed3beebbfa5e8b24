"""kiln's native checks (native/__init__.py): they build and load; `data_ptrs` answers exactly as
`Tensor.data_ptr()` does; bad rows are refused with a reason; tables made before the module
loaded move onto it; and where it cannot be built, kiln says why once and runs correctly."""

import os
import textwrap

import pytest
import torch
import torch.nn as nn

from kiln import native


@pytest.fixture(scope="module", autouse=True)
def loaded():
    assert native.wait(), f"the native checks did not build: {native.status()}"


class Sub(torch.Tensor):
    def data_ptr(self):  # a subclass may answer differently: it is asked through Python
        return 12345


def test_data_ptrs_match_python():
    base = torch.randn(10, 10)
    items = [base, base[3:, 2:], nn.Parameter(torch.randn(3)), torch.empty(0), base.t()]
    items.append(torch.randn(4).as_subclass(Sub))
    assert native.data_ptrs is not native._python_data_ptrs
    assert native.data_ptrs(items) == tuple(t.data_ptr() for t in items)
    assert native.data_ptrs(tuple(items)) == native._python_data_ptrs(items)
    assert native.data_ptrs(items)[-1] == 12345


def test_data_ptrs_of_a_non_tensor_raises_as_python_does():
    with pytest.raises(AttributeError):
        native.data_ptrs([torch.randn(2), 3])
    with pytest.raises(AttributeError):
        native._python_data_ptrs([torch.randn(2), 3])


def test_as_strided_is_torch_as_strided():
    make = native.as_strided()
    assert make is not torch.as_strided
    base = torch.randn(6, 7)
    for args in (((6, 7), (7, 1)), ((7, 6), (1, 7)), ((3, 2), (7, 2), 5), ((4, 7), (0, 1), 0)):
        got, want = make(base, *args), torch.as_strided(base, *args)
        assert (got.shape, got.stride(), got.storage_offset()) == (
            want.shape,
            want.stride(),
            want.storage_offset(),
        )
        assert got._base is base and torch.equal(got, want)
    view = base[2:]  # no offset given: the base's own, as torch's
    assert make(view, (2, 2), (1, 1)).storage_offset() == view.storage_offset()
    leaf = torch.randn(5, requires_grad=True)
    out = make(leaf, (2,), (2,), 1)
    out.sum().backward()
    assert type(out.grad_fn).__name__ == "AsStridedBackward0"
    assert leaf.grad.tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]


def test_as_strided_refuses_what_torch_refuses():
    make = native.as_strided()
    with pytest.raises(TypeError):
        make([1, 2], (1,), (1,))
    with pytest.raises(TypeError):
        make(torch.randn(3), (1, "a"), (1, 1))
    with pytest.raises(RuntimeError):
        make(torch.randn(3), (2, 2), (1,))  # size and stride of different lengths


def test_bad_rows_are_refused_with_a_reason():
    module = native._state["module"]
    with pytest.raises(ValueError, match="tensor row is"):
        module.prepare("tensors", ((torch.randn(2), torch.Tensor),), ())
    with pytest.raises(ValueError, match="plain dict"):
        module.prepare("items", (([], "k", int, 1),), ())
    with pytest.raises(ValueError, match="unknown table kind"):
        module.prepare("sizes", (), ())


def test_a_table_made_before_loading_moves_onto_the_module():
    t = torch.randn(2, 3)
    row = (t, torch.Tensor, t.dtype, t.device, (2, 3), (3, 1), False)
    calls = []
    table = native.Table("tensors", (row,), (), lambda: calls.append(1) or True)
    assert table.check() and calls == [1] and not table.is_native
    table._upgrade(native._state["module"])
    assert table.is_native and table.check() is True and calls == [1]
    t.unsqueeze_(0)
    assert table.check() is False


def _wrapper_built_while_building(monkeypatch):
    """A compiled C++ wrapper loaded (codegen/cpp/load.py) while the module is still being
    built: it takes `torch.as_strided`."""
    from kiln.codegen.cpp import load as cpp_load

    monkeypatch.setitem(native._state, "module", None)
    monkeypatch.setitem(native._state, "status", "building")
    monkeypatch.setattr(native, "_later", [])
    source = "def call(args):\n    x, = args\n    return (_as_strided(x, (2, 3), (1, 2), 1),)\n"
    data = {"source": "", "kernels": {}, "wrapper": source, "externs": {}, "constants": {}}
    call = cpp_load.load(data)
    assert call.__globals__["_as_strided"] is torch.as_strided
    return call


def test_a_wrapper_built_before_loading_takes_the_native_as_strided_once_loaded(monkeypatch):
    module = native._state["module"]
    call = _wrapper_built_while_building(monkeypatch)
    x = torch.randn(8)
    (before,) = call([x])
    with native._lock:
        native._loaded(module)  # what the building thread does once the module is built
    assert call.__globals__["_as_strided"] is module.as_strided and native._later == []
    (after,) = call([x])
    want = torch.as_strided(x, (2, 3), (1, 2), 1)
    for got in (before, after):
        assert got.stride() == want.stride() and got.storage_offset() == 1
        assert got._base is x and torch.equal(got, want)


def test_a_wrapper_gone_or_a_module_that_never_loads_upgrades_nothing(monkeypatch):
    import gc

    module = native._state["module"]
    call = _wrapper_built_while_building(monkeypatch)
    del call
    gc.collect()
    with native._lock:
        native._loaded(module)  # the wrapper is gone: held weakly, nothing to upgrade
    call = _wrapper_built_while_building(monkeypatch)
    monkeypatch.setitem(native._state, "error", "")
    native._finish("failed", "no compiler here")  # what a failed build ends with
    assert native._later == [] and call.__globals__["_as_strided"] is torch.as_strided


def test_a_table_whose_rows_do_not_fit_stays_in_python():
    table = native.Table("tensors", (("not a tensor",),), (), lambda: True)
    table._upgrade(native._state["module"])
    assert not table.is_native and table.check() is True


def test_the_cli_builds_and_says_where(run_python):
    out = run_python("-m", "kiln", "native")
    assert "ready" in out.stdout and "kiln_native_" in out.stdout


SCRIPT = textwrap.dedent(
    """
    import logging, torch, torch.nn as nn, kiln
    from kiln import native
    kiln.set_logs("perf_hints")
    torch.manual_seed(0)
    mod = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    cm = kiln.compile(mod, backend="eager")
    x = torch.randn(3, 4)
    for _ in range(3):
        torch.testing.assert_close(cm(x), mod(x))
    native.wait(600)
    mod.double()
    torch.testing.assert_close(cm(x.double()), mod(x.double()))
    print("status", *native.status())
    """
)


def test_without_a_compiler_kiln_says_why_and_runs(tmp_path, run_python):
    env = dict(os.environ, PATH=str(tmp_path), KILN_NATIVE_DIR=str(tmp_path / "native"))
    out = run_python("-c", SCRIPT, env=env)
    assert "status failed" in out.stdout and "C++ compiler" in out.stdout
    assert out.stderr.count("native checks: could not build them") == 1


def test_native_off_runs_in_python(run_python):
    out = run_python("-c", SCRIPT, env=dict(os.environ, KILN_NATIVE="0"))
    assert "status off KILN_NATIVE=0" in out.stdout
