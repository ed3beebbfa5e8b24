"""Which optimizers a trace makes capturable (capture/optimizers.py): only those whose parameters
live on one device type torch's optimizers accept `capturable=True` on."""

import torch

from kiln.capture import optimizers


def _adam_on(device: str) -> torch.optim.Adam:
    params = [torch.nn.Parameter(torch.randn(4, 3, device=device)) for _ in range(2)]
    return torch.optim.Adam(params, lr=1e-3)


def test_cpu_and_unsupported_devices_keep_their_optimizer_unchanged():
    for device in ("cpu", "meta"):  # meta is not in torch's capturable list
        opt = _adam_on(device)
        optimizers.keep_state_on_device(opt)
        assert opt.param_groups[0]["capturable"] is False


def test_a_device_type_in_torchs_capturable_list_is_made_capturable(monkeypatch):
    # torch decides which devices support capturable steps; kiln follows its list
    monkeypatch.setattr(optimizers, "_capturable_device_types", lambda: ("meta",))
    opt = _adam_on("meta")
    optimizers.keep_state_on_device(opt)
    assert opt.param_groups[0]["capturable"] is True


def test_the_list_is_torchs_own():
    from torch.optim.optimizer import _get_capturable_supported_devices

    assert optimizers._capturable_device_types() == tuple(_get_capturable_supported_devices())
