"""Guards of a module's own state, which kiln reads cheaply (parameters held under the
module-structure guard, other attributes from the module's instance dictionary): every change
that keeps the same Parameter or module objects is still seen on the next call, recompiles, and
matches eager; `KILN_LOGS=recompiles` names what changed."""

import pytest
import torch
import torch.nn as nn
from harness import CollectLogs, CountingBackend

import kiln


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(3)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(torch.relu(self.bn(self.conv(x))))


def _compiled():
    torch.manual_seed(0)
    mod = ConvNet().eval()
    backend = CountingBackend()
    return mod, kiln.compile(mod, backend=backend), backend


def _check(cm, mod, backend, graphs, dtype=torch.float32):
    x = torch.randn(2, 3, 4, 4, dtype=dtype)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), mod(x))
        torch.testing.assert_close(cm(x), mod(x))
    assert len(backend.graphs) == graphs


def _recompile_reason(cm, change) -> str:
    kiln.set_logs("recompiles")
    try:
        with CollectLogs("kiln.recompiles") as log:
            change()
            with torch.no_grad():
                cm(torch.randn(2, 3, 4, 4))
    finally:
        kiln.set_logs()
    return "\n".join(log.messages)


def test_half_keeps_parameter_objects_and_recompiles():
    mod, cm, backend = _compiled()
    _check(cm, mod, backend, 1)
    weight = mod.conv.weight
    mod.half()  # assigns `.data`: the same Parameter objects, now float16
    assert mod.conv.weight is weight and weight.dtype is torch.float16
    _check(cm, mod, backend, 2, torch.float16)


def test_parameter_data_transposed_recompiles():
    mod, cm, backend = _compiled()
    _check(cm, mod, backend, 1)
    w = mod.lin.weight
    w.data = w.data.t()  # same sizes, other strides and values
    assert mod.lin.weight is w and not w.is_contiguous()
    _check(cm, mod, backend, 2)


def test_requires_grad_of_a_parameter_recompiles():
    mod, cm, backend = _compiled()
    _check(cm, mod, backend, 1)
    mod.lin.weight.requires_grad_(False)
    _check(cm, mod, backend, 2)


def test_empty_parameter_slot_filled_recompiles():
    mod, cm, backend = _compiled()
    _check(cm, mod, backend, 1)
    mod.conv.bias = nn.Parameter(torch.randn(3))  # `conv.bias` was None
    _check(cm, mod, backend, 2)


def test_module_constant_change_recompiles_and_is_named():
    mod, cm, backend = _compiled()
    _check(cm, mod, backend, 1)

    def change():
        mod.bn.eps = 0.5

    text = _recompile_reason(cm, change)
    assert "L['self'].bn.eps" in text and "0.5" in text, text
    _check(cm, mod, backend, 2)


def test_replaced_instance_dict_is_seen():
    mod, cm, backend = _compiled()
    _check(cm, mod, backend, 1)
    mod.bn.__dict__ = dict(mod.bn.__dict__, eps=0.25)  # the held dictionary is now stale
    assert mod.bn.eps == 0.25
    _check(cm, mod, backend, 2)


def test_hook_registered_after_compile_runs():
    mod, cm, backend = _compiled()
    _check(cm, mod, backend, 1)
    mod.bn.register_forward_hook(lambda m, args, out: out * 2)
    _check(cm, mod, backend, 2)


def test_changed_parameter_is_named_in_recompile_log():
    mod, cm, backend = _compiled()
    _check(cm, mod, backend, 1)

    def change():
        mod.lin.weight.data = mod.lin.weight.data.t()

    text = _recompile_reason(cm, change)
    assert "L['self'].lin.weight" in text and "now Parameter(" in text, text
    assert "stride=[4, 1]" in text and "stride=[1, 4]" in text, text


def _check_fresh_inputs(cm, mod, calls=3):
    with torch.no_grad():
        for _ in range(calls):
            x = torch.randn(2, 3, 4, 4)
            torch.testing.assert_close(cm(x), mod(x))


def _bias_to_none(mod):
    mod.lin.bias = None  # Module.__setattr__ -> register_parameter("bias", None)


def _register_none(mod):
    mod.lin.register_parameter("bias", None)


def _delete_then_plain_none(mod):
    del mod.lin.bias  # the slot is gone; `bias` is then a plain attribute
    mod.lin.bias = None


def _buffers_to_none(mod):
    mod.bn.running_mean = None  # batch norm then normalizes with the batch's statistics
    mod.bn.running_var = None


@pytest.mark.parametrize(
    "empty", [_bias_to_none, _register_none, _delete_then_plain_none, _buffers_to_none]
)
def test_emptied_slot_recompiles_and_matches_eager(empty):
    """A parameter or buffer slot emptied after compiling (set to None, or deleted) changes
    the module's structure: the entry holding the old tensor must not run again."""
    mod, cm, backend = _compiled()
    _check_fresh_inputs(cm, mod)
    empty(mod)
    _check_fresh_inputs(cm, mod)
    assert len(backend.graphs) == 2


class Scaled(nn.Module):
    """One constant attribute (`scale`) beside the hook dictionaries: a one-key table row."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * 2 if self.scale is True else x * self.scale


@pytest.mark.parametrize("before, after", [(1, True), (1.0, 1), (2, 3)])
def test_attribute_of_another_type_or_value_recompiles(before, after):
    """Attribute constants are checked per object, types before values: `1 == True == 1.0`
    must not let an entry traced for one run for the other."""
    torch.manual_seed(0)
    mod = Scaled(before)
    backend = CountingBackend()
    cm = kiln.compile(mod, backend=backend)
    for value, graphs in ((before, 1), (after, 2)):
        mod.scale = value
        x = torch.randn(3, 4)
        torch.testing.assert_close(cm(x), mod(x))
        assert len(backend.graphs) == graphs


def test_many_attributes_of_many_modules_each_change_is_seen():
    torch.manual_seed(0)
    mod = nn.Sequential(*[nn.BatchNorm1d(4) for _ in range(3)]).eval()
    backend = CountingBackend()
    cm = kiln.compile(mod, backend=backend)
    with torch.no_grad():
        for k, (name, value) in enumerate([("eps", 0.3), ("momentum", 0.5), ("affine", False)]):
            x = torch.randn(5, 4)
            torch.testing.assert_close(cm(x), mod(x))
            assert len(backend.graphs) == k + 1
            setattr(mod[k], name, value)
        x = torch.randn(5, 4)
        torch.testing.assert_close(cm(x), mod(x))
