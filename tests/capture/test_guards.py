"""Guards: a changed global, module attribute, Python argument, dtype or shape is noticed,
recompiles with the new behaviour, and `KILN_LOGS=recompiles` names the failed guard."""

import pytest
import torch
import torch.nn as nn
from harness import CollectLogs as _Collect
from harness import CountingBackend

import kiln

FACTOR = 2.0


def uses_global(x):
    return x * FACTOR


def test_global_change_recompiles():
    global FACTOR
    backend = CountingBackend()
    f = kiln.compile(uses_global, backend=backend)
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x * 2.0)
    FACTOR = 5.0
    try:
        torch.testing.assert_close(f(x), x * 5.0)
    finally:
        FACTOR = 2.0
    torch.testing.assert_close(f(x), x * 2.0)
    assert len(backend.graphs) == 2  # the 2.0 entry is reused


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = 1.0

    def forward(self, x):
        return self.lin(x) * self.scale


def test_module_attribute_change_recompiles():
    mod = Scaled()
    backend = CountingBackend()
    cm = kiln.compile(mod, backend=backend)
    x = torch.randn(2, 3)
    torch.testing.assert_close(cm(x), mod(x))
    mod.scale = 3.0
    torch.testing.assert_close(cm(x), mod.lin(x) * 3.0)
    assert len(backend.graphs) == 2


def test_parameter_replacement_is_seen():
    mod = Scaled()
    cm = kiln.compile(mod, backend="eager")
    x = torch.randn(2, 3)
    cm(x)
    mod.lin.weight = nn.Parameter(torch.randn(3, 3))
    torch.testing.assert_close(cm(x), mod(x))


def test_python_argument_change_recompiles():
    backend = CountingBackend()
    f = kiln.compile(lambda x, n, flag: x * n if flag else x - n, backend=backend)
    x = torch.randn(4)
    torch.testing.assert_close(f(x, 2, True), x * 2)
    torch.testing.assert_close(f(x, 3, True), x * 3)
    torch.testing.assert_close(f(x, 3, False), x - 3)
    torch.testing.assert_close(f(x, 2, True), x * 2)
    assert len(backend.graphs) == 3


def test_dtype_change_recompiles():
    backend = CountingBackend()
    f = kiln.compile(lambda x: x.sin() * 2, backend=backend)
    a = torch.randn(4)
    torch.testing.assert_close(f(a), a.sin() * 2)
    b = torch.randn(4, dtype=torch.float64)
    out = f(b)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, b.sin() * 2)
    assert len(backend.graphs) == 2


def test_shape_change_recompiles():
    backend = CountingBackend()
    f = kiln.compile(lambda x: x.view(-1, 2).sum(0), backend=backend)
    for n in (4, 8, 4):
        x = torch.randn(n)
        torch.testing.assert_close(f(x), x.view(-1, 2).sum(0))
    assert len(backend.graphs) == 2


def test_training_flag_change_recompiles():
    mod = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    backend = CountingBackend()
    cm = kiln.compile(mod, backend=backend)
    x = torch.randn(8, 4)
    mod.eval()
    torch.testing.assert_close(cm(x), mod(x))
    mod.train()
    torch.manual_seed(3)
    got = cm(x)
    torch.manual_seed(3)
    torch.testing.assert_close(got, mod(x))
    assert len(backend.graphs) == 2


def test_requires_grad_and_grad_mode_are_guarded():
    backend = CountingBackend()
    f = kiln.compile(lambda x: x * 3, backend=backend)
    x = torch.randn(3)
    assert not f(x).requires_grad
    y = torch.randn(3, requires_grad=True)
    assert f(y).requires_grad
    with torch.no_grad():
        assert not f(y).requires_grad
    assert len(backend.graphs) == 3


def test_recompile_log_names_guard_and_value():
    kiln.set_logs("recompiles")
    try:
        with _Collect("kiln.recompiles") as log:
            f = kiln.compile(lambda x: x + 1, backend="eager")
            f(torch.randn(2))
            f(torch.randn(5))
    finally:
        kiln.set_logs()
    text = "\n".join(log.messages)
    assert "L['x']" in text and "dim 0 changed from 2 to 5" in text, text


def test_cache_limit_falls_back_to_eager_with_warning():
    f = kiln.compile(lambda x, n: x * n, backend="eager", options={"cache_size_limit": 3})
    x = torch.randn(2)
    with pytest.warns(kiln.KilnRecompileLimitWarning, match="cache_size_limit"):
        for n in range(6):
            torch.testing.assert_close(f(x, n), x * n)
    state = f._kiln_compiled
    assert len(state.entries) == 3 and state.eager_reason == "cache size limit"


def test_same_tensor_twice_is_guarded_as_alias():
    backend = CountingBackend()
    f = kiln.compile(lambda a, b: a.add_(1) * b, backend=backend)
    x = torch.randn(3)
    ref = x.clone()
    out = f(x, x)
    torch.testing.assert_close(out, (ref + 1) * (ref + 1))
    y, z = torch.randn(3), torch.randn(3)
    y0 = y.clone()
    torch.testing.assert_close(f(y, z), (y0 + 1) * z)
    assert len(backend.graphs) == 2


@pytest.mark.parametrize("value", [1, 2.5, "s", None, (1, 2), torch.float16])
def test_constant_arguments_are_guarded(value):
    seen = []
    f = kiln.compile(lambda x, v: (x * 2, v), backend="eager")
    out = f(torch.ones(1), value)
    seen.append(out[1])
    assert f(torch.ones(1), value)[1] == value
    assert f(torch.ones(1), "other")[1] == "other"


def test_building_unrelated_modules_between_calls_does_not_recompile():
    mod = Scaled()
    backend = CountingBackend()
    cm = kiln.compile(mod, backend=backend)
    for _ in range(3):
        nn.Sequential(nn.Linear(2, 2), nn.ReLU())  # e.g. a library making cache objects
        x = torch.randn(2, 3)
        torch.testing.assert_close(cm(x), mod(x))
    assert len(backend.graphs) == 1


def test_module_built_inside_forward_does_not_recompile():
    class Builds(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            scratch = nn.ModuleList()  # transformers builds cache containers like this
            return self.lin(x) + len(scratch)

    mod = Builds()
    backend = CountingBackend()
    cm = kiln.compile(mod, backend=backend)
    for _ in range(3):
        x = torch.randn(2, 3)
        torch.testing.assert_close(cm(x), mod(x))
    assert len(backend.graphs) == 1


def test_cuda_device_check_reads_the_index_only_with_several_devices(monkeypatch):
    """A CUDA tensor's guard reads `is_cuda`, plus `get_device()` when the process sees more
    than one CUDA device (with one, `is_cuda` already says which); it never builds a
    `torch.device` per call. Checked on stand-ins, so it runs without a GPU."""
    from kiln.capture.guards import _device_check

    class On:
        def __init__(self, cuda, index):
            self.is_cuda, self._index = cuda, index

        def get_device(self):
            return self._index

    def holds(check, t):
        return eval(check.format(s="t"), {"t": t})

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    one = _device_check(torch.device("cuda", 0))
    assert "get_device" not in one
    assert holds(one, On(True, 0)) and not holds(one, On(False, -1))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for index in (0, 1):
        several = _device_check(torch.device("cuda", index))
        assert holds(several, On(True, index))
        assert not holds(several, On(True, 1 - index)) and not holds(several, On(False, -1))
