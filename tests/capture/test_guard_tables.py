"""Guard tables checked natively (capture/guard_tables.py, native/__init__.py): for every change
to a held tensor, attribute constant, instance dictionary or hook dictionary, the C++ check and
the table's Python loop give the same answer, and a compiled module sees the change, recompiles
and matches eager, with the native module loaded and without it. Tensors fetched on each call
(through a list or dict) are checked one native call each, with the same answers."""

import os
import textwrap

import pytest
import torch
import torch.nn as nn

from kiln import native
from kiln.capture import guards as G
from kiln.capture.sources import ConstSource, InstanceDictSource, Namer


@pytest.fixture(scope="module", autouse=True)
def loaded():
    assert native.wait(), f"the native checks did not build: {native.status()}"


def _tables(guards: list[G.Guard]) -> list[native.Table]:
    gs = G.GuardSet()
    for g in guards:
        gs.add(g)
    namer = Namer()
    gs.check_lines(namer)
    return [v for v in namer.namespace.values() if isinstance(v, native.Table)]


def _agree(table: native.Table) -> bool:
    """Both checks of one table, which must agree; the answer."""
    assert table.is_native
    try:
        slow = table.python()
    except (KeyError, AttributeError):  # in the entry function, a miss
        slow = False
    fast = table.check()
    assert fast is slow, (table.kind, fast, slow)
    return fast


def _tensor_table(tensors):
    guards = [G.tensor_guard(ConstSource(t, f"t{i}"), t) for i, t in enumerate(tensors)]
    (table,) = _tables(guards)
    assert table.kind == "tensors"
    return table


TENSOR_CHANGES = {  # (parameter, buffer) -> change one of them in place
    "data of another dtype": lambda p, b: setattr(p, "data", p.data.double()),
    "data of another shape": lambda p, b: setattr(p, "data", torch.randn(5, 2)),
    "requires_grad off": lambda p, b: p.requires_grad_(False),
    "resize_": lambda p, b: b.resize_(20),
    "transpose_ (strides)": lambda p, b: b.t_(),
    "as_strided_": lambda p, b: b.as_strided_((3, 4), (1, 3)),
    "unsqueeze_": lambda p, b: b.unsqueeze_(0),
}


@pytest.mark.parametrize("change", sorted(TENSOR_CHANGES))
def test_tensor_table_sees_each_change(change):
    torch.manual_seed(0)
    p, buf = nn.Parameter(torch.randn(4, 5)), torch.randn(3, 4)
    table = _tensor_table([p, buf, torch.randn(2, 2)])
    assert _agree(table)
    TENSOR_CHANGES[change](p, buf)
    assert not _agree(table)


def test_tensor_rows_compare_the_device():
    t = torch.randn(2, 3)
    facts = (type(t), t.dtype)
    shape, stride = tuple(t.shape), t.stride()
    here = native.table("tensors", ((t, *facts, t.device, shape, stride, False),), (), None)
    meta = torch.device("meta")
    elsewhere = native.table("tensors", ((t, *facts, meta, shape, stride, False),), (), None)
    assert here.check() is True and elsewhere.check() is False


def test_tensor_table_holds_across_value_and_storage_changes():
    p = nn.Parameter(torch.randn(4, 5))
    table = _tensor_table([p, torch.randn(3)])
    with torch.no_grad():
        p.mul_(2)
    p.data = torch.randn(4, 5)  # new storage, same facts: the table holds (addresses are the
    assert _agree(table)  # device graph's concern)


def test_strided_and_buffer_rows():
    base = torch.randn(6, 8)
    view = base[:, ::2]
    table = _tensor_table([view, torch.randn(3, 1).expand(3, 4)])
    assert _agree(table)
    base.t_()
    assert _agree(table)  # the view is its own tensor


def _spec_of(t: torch.Tensor) -> native.Table:
    """The spec a tensor guard on a fetched (not held) source checks with."""
    return G._tensor_spec(G.tensor_guard(ConstSource(t, "t"), t).held)


@pytest.mark.parametrize("change", sorted(TENSOR_CHANGES))
def test_fetched_tensor_spec_sees_each_change(change):
    """A tensor read through a list or dict on every call (an optimizer's parameters and
    state) is checked by one native call: each change is seen, as by the Python check."""
    torch.manual_seed(0)
    p, buf = nn.Parameter(torch.randn(4, 5)), torch.randn(3, 4)
    specs = [(_spec_of(p), p), (_spec_of(buf), buf)]
    for spec, t in specs:
        assert spec.is_native and spec.check(t) is spec.python(t) is True
    TENSOR_CHANGES[change](p, buf)
    answers = [(spec.check(t), spec.python(t)) for spec, t in specs]
    assert all(fast is slow for fast, slow in answers), answers
    assert not all(fast for fast, _ in answers)


def test_fetched_tensor_spec_checks_type_and_device():
    t = torch.randn(2, 3)
    spec = _spec_of(t)
    for other in (nn.Parameter(t.clone()), t.to("meta"), 3, None, [t]):
        assert spec.check(other) is False and spec.python(other) is False
    assert _spec_of(torch.randn(2, 3)) is spec  # equal facts share one spec


def test_fetched_tensors_are_checked_natively_and_recompile_on_change():
    """An entry reading tensors through a list checks each with one `.check(...)` call and
    recompiles when one of them changes, matching eager."""
    from harness import CollectLogs, CountingBackend

    import kiln

    def f(ts):
        return ts[0] * 2 + ts[1].sum()

    backend = CountingBackend()
    cf = kiln.compile(f, backend=backend)
    ts = [torch.randn(4, 5), torch.randn(3)]
    kiln.set_logs("bytecode")
    try:
        with CollectLogs("kiln.bytecode") as log:
            torch.testing.assert_close(cf(ts), f(ts))
    finally:
        kiln.set_logs()
    entry = "\n".join(log.messages)
    assert entry.count(".check((___seen") == 2, entry
    ts2 = [torch.randn(4, 5), torch.randn(3)]
    torch.testing.assert_close(cf(ts2), f(ts2))
    assert len(backend.graphs) == 1
    ts3 = [torch.randn(5, 4).t(), torch.randn(3)]  # other strides
    torch.testing.assert_close(cf(ts3), f(ts3))
    ts4 = [torch.randn(4, 5), torch.randn(3, dtype=torch.float64)]
    torch.testing.assert_close(cf(ts4), f(ts4))
    assert len(backend.graphs) == 3


def test_item_table_checks_type_and_value():
    class Holder:
        pass

    h = Holder()
    h.eps, h.momentum, h.name, h.flag = 1e-5, 0.1, "bn", True
    d = h.__dict__
    guards = [
        G.constant_guard(InstanceDictSource(ConstSource(h, "h"), k), d[k])
        for k in ("eps", "momentum", "name", "flag")
    ]
    (table,) = _tables(guards)
    assert table.kind == "items" and _agree(table)
    h.momentum = 0.1 + 0.0  # an equal value: holds
    assert _agree(table)
    h.flag = 1  # equal, but an int: the type differs
    assert not _agree(table)
    h.flag = True
    h.eps = 1e-3
    assert not _agree(table)
    h.eps = 1e-5
    del h.name
    assert not _agree(table)


def test_dict_and_hook_tables():
    mods = [nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)]
    hook_names = ("_forward_pre_hooks", "_forward_hooks")
    guards = [G.dict_guard(ConstSource(m, f"m{i}"), m.__dict__) for i, m in enumerate(mods)]
    guards += [
        G.no_hooks_guard(ConstSource(m, f"m{i}"), hook_names, m.__dict__)
        for i, m in enumerate(mods)
    ]
    dicts, hooks = sorted(_tables(guards), key=lambda t: t.kind)
    assert (dicts.kind, hooks.kind) == ("dicts", "empty")
    assert _agree(dicts) and _agree(hooks)
    handle = mods[2].register_forward_hook(lambda m, i, o: o)
    assert not _agree(hooks)
    handle.remove()
    assert _agree(hooks)
    mods[1].__dict__ = dict(mods[1].__dict__)  # the same contents in another dictionary
    assert not _agree(dicts)


def test_a_compiled_module_uses_native_tables():
    from harness import CollectLogs, CountingBackend

    import kiln

    torch.manual_seed(0)
    mod = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3)).eval()
    backend = CountingBackend()
    cm = kiln.compile(mod, backend=backend)
    x = torch.randn(2, 3, 8, 8)
    kiln.set_logs("bytecode")
    try:
        with CollectLogs("kiln.bytecode") as log, torch.no_grad():
            torch.testing.assert_close(cm(x), mod(x))
    finally:
        kiln.set_logs()
    entry = "\n".join(log.messages)
    assert "rows of: type(___r_s) is ___r_t and ___r_s.dtype is ___r_d" in entry  # the tensors
    assert entry.count(".check():") >= 3  # and the module dictionaries, hooks, constants
    mod.half()  # `.data` of every parameter changes dtype: the tensor table must see it
    xh = torch.randn(2, 3, 8, 8, dtype=torch.float16)
    with torch.no_grad():
        torch.testing.assert_close(cm(xh), mod(xh))
    assert len(backend.graphs) == 2


SCRIPT = textwrap.dedent(
    """
    import torch, torch.nn as nn, kiln
    from kiln import native
    torch.manual_seed(0)
    mod = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 4)).eval()
    cm = kiln.compile(mod, backend="eager")
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), mod(x))
        mod[1].eps = 1e-2                    # an attribute constant
        torch.testing.assert_close(cm(x), mod(x))
        mod[0].weight.data = torch.randn(4, 4).t()   # strides of a held tensor
        torch.testing.assert_close(cm(x), mod(x))
        mod[2].register_forward_hook(lambda m, i, o: o * 2)   # a hook
        torch.testing.assert_close(cm(x), mod(x))
    print("status", native.status()[0])
    """
)


def test_without_native_checks_the_same_changes_are_seen(run_python):
    out = run_python("-c", SCRIPT, env=dict(os.environ, KILN_NATIVE="0"), timeout=300)
    assert "status off" in out.stdout
