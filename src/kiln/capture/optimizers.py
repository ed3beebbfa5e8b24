"""An optimizer stepped inside a trace keeps its state on its parameters' device.

Takes a `torch.optim.Optimizer` whose method the trace is about to call (calls.py, for
`kiln.compile(opt.step)` and for `opt.step()` inside a compiled function); when every parameter
lives on one accelerator of a type torch's optimizers support `capturable` on (CUDA, XPU, ...;
not the CPU), sets `capturable=True` in each parameter group that has the flag, and moves each
state's CPU step count (`state[p]["step"]`) to its parameter's device.
It changes the optimizer itself, as torch.compile does with the same optimizer (its
`capturable` and step moves); values are unchanged, and eager steps after it (a fallback, the
uncompiled `opt.step`) take the same path, which torch supports for capturable optimizers.

Why: with `capturable=False`, the default, torch's Adam, AdamW, and the others with a step
count keep it as a 0-d CPU tensor per parameter, and a traced step computes the bias
corrections and step sizes from those counts on the CPU. In a graph over CUDA parameters every
such op has its output on the CPU, so it stays an ATen call (lower/graph.py), and so does each
parameter's update that reads one (a kernel cannot read CPU memory): GPT-2's 148 parameters
made a step of hundreds of small host-side ATen calls and per-parameter launches, seven times
slower than eager's foreach step. With the counts on the device, the whole step is a few
kernels (schedule/horizontal.py) and no host work.
"""

from __future__ import annotations

import torch


def _capturable_device_types() -> tuple[str, ...]:
    """The device types torch's optimizers accept `capturable=True` on (they check it on every
    capturable step, eager ones included, so a device outside it keeps its CPU counts)."""
    from torch.optim import optimizer

    supported = getattr(optimizer, "_get_capturable_supported_devices", None)
    return tuple(supported()) if supported is not None else ("cuda",)


def keep_state_on_device(opt: torch.optim.Optimizer) -> None:
    """`opt`'s groups capturable and its step counts on its parameters' device (module doc);
    nothing when a parameter is on the CPU, when the parameters span devices, or for a fused
    group (its kernels take the counts where they are)."""
    groups = getattr(opt, "param_groups", None)
    if not isinstance(groups, list) or not groups:
        return
    devices = {p.device for g in groups for p in g.get("params", ()) if isinstance(p, torch.Tensor)}
    if len(devices) != 1 or next(iter(devices)).type not in _capturable_device_types():
        return
    for group in groups:
        if group.get("capturable") is False and not group.get("fused"):
            group["capturable"] = True
    state = getattr(opt, "state", None)
    if not isinstance(state, dict):
        return
    for group in groups:
        if not group.get("capturable") or group.get("fused"):
            continue
        for p in group["params"]:
            entry = state.get(p)
            step = entry.get("step") if isinstance(entry, dict) else None
            if isinstance(step, torch.Tensor) and step.device != p.device:
                entry["step"] = step.to(p.device)
