"""A module class that overrides `__call__` runs its own `__call__` inside a trace, as Python does.

kiln models `module(x)` as `nn.Module.__call__` (hooks, then forward). A class with its own
`__call__` (Hugging Face's `GradientCheckpointingLayer` in transformers 5.17 wraps the call in
`checkpoint(partial(super().__call__, ...))`) lost what that `__call__` does: results stayed equal
while the checkpointing silently did not happen (the compiled Llama step saved as much with
checkpointing on as off). `super().__call__(...)` and `nn.Module.__call__(m, ...)` keep
Module.__call__'s semantics (hooks, forward).
"""

from __future__ import annotations

import functools

import torch
import torch.utils.checkpoint as tc

import kiln
from kiln.autograd import aot_compile
from kiln.autograd.backend import eager_graph


class Scaled(torch.nn.Linear):
    """`__call__` doubles whatever Module.__call__ gives (hooks included)."""

    def __call__(self, *args, **kwargs):
        return 2 * super().__call__(*args, **kwargs)


class Direct(torch.nn.Linear):
    def __call__(self, x):
        return torch.nn.Module.__call__(self, x) - 1


def test_overridden_call_runs_and_hooks_still_run():
    torch.manual_seed(0)
    mods = [Scaled(8, 8), Direct(8, 8)]
    seen = []
    for m in mods:
        m.register_forward_hook(lambda mod, inp, out: seen.append(type(mod).__name__))

    def f(x):
        return mods[1](mods[0](x)).tanh()

    compiled = kiln.compile(f, fullgraph=True)
    x = torch.randn(4, 8)
    expected = f(x)
    seen.clear()
    torch.testing.assert_close(compiled(x), expected)
    assert seen == ["Scaled", "Direct"]  # forward hooks ran inside the overridden calls


class CheckpointedBlock(torch.nn.Module):
    """transformers 5.17's GradientCheckpointingLayer pattern: the call itself checkpoints."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)
        self.checkpointing = False
        self._ckpt = functools.partial(tc.checkpoint, use_reentrant=False)

    def forward(self, x, scale=1.0):
        return x + scale * self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    def __call__(self, *args, **kwargs):
        if self.checkpointing and self.training:
            return self._ckpt(functools.partial(super().__call__, **kwargs), *args)
        return super().__call__(*args, **kwargs)


def _partition_notes(checkpointing: bool) -> tuple[list[str], list]:
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(CheckpointedBlock(16) for _ in range(3))
    for b in blocks:
        b.checkpointing = checkpointing

    def step(x):
        for b in blocks:
            x = b(x, scale=0.5)
        return x.pow(2).mean()

    store: list = []

    def backend(gm, example_inputs):
        compiled = aot_compile(gm, example_inputs, fw_compiler=eager_graph, bw_compiler=eager_graph)
        store.append(compiled)
        return compiled

    x = torch.randn(8, 16)
    compiled = kiln.compile(step, backend=backend, fullgraph=True)
    compiled(x).backward()
    got = [p.grad.clone() for p in blocks.parameters()]
    for p in blocks.parameters():
        p.grad = None
    step(x).backward()
    for a, p in zip(got, blocks.parameters()):
        torch.testing.assert_close(a, p.grad)
    (part,) = [p for c in store for p in c.partitions.values()]
    return part.notes, got


def test_checkpointing_inside_an_overridden_call_is_honoured():
    notes, _ = _partition_notes(checkpointing=True)
    assert any(n.startswith("checkpointed:") for n in notes), notes
    plain, _ = _partition_notes(checkpointing=False)
    assert not any(n.startswith("checkpointed:") for n in plain), plain
