"""A kiln-compiled module is transparent to PyTorch's composable module APIs (one process):
it stands in the module tree where it was put, hooks registered on it run around the compiled
forward, global module hooks fire once per module as in eager, checkpoint_wrapper recomputes
through it, and state-dict hooks on it or on the original both run."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from training import Block, make_net

import kiln


def test_compiled_module_stands_in_the_tree():
    net = make_net()
    net.layers[0] = kiln.compile(net.layers[0], backend="eager")
    assert any(m is net.layers[0] for m in net.modules())
    names = dict(net.named_modules())
    assert names["layers.0"] is net.layers[0]._orig_mod  # the original too, at the same name
    assert "layers.0.fc1" in names
    assert [n for n, _ in net.named_parameters()] == [n for n, _ in make_net().named_parameters()]


def test_global_module_hooks_fire_once_per_module_as_in_eager():
    calls = []

    def hook(mod, args, out):
        calls.append(type(mod).__name__)

    x = torch.randn(2, 3, 12)
    eager, net = make_net(), make_net()
    compiled = kiln.compile(net, backend="eager")
    handle = nn.modules.module.register_module_forward_hook(hook)
    try:
        expected = eager(x)
        eager_calls, calls[:] = list(calls), []
        for _ in range(2):
            calls.clear()
            torch.testing.assert_close(compiled(x), expected)
            assert calls == eager_calls
    finally:
        handle.remove()


def test_hooks_on_the_compiled_module_run_around_it():
    x = torch.randn(2, 3, 16)
    block = Block(16)
    eager = Block(16)
    eager.load_state_dict(block.state_dict())
    compiled = kiln.compile(block, backend="aot_eager")
    for m in (eager, compiled):
        m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
        m.register_forward_hook(lambda mod, args, out: out + 1)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), eager(x))


def test_checkpoint_wrapper_around_a_compiled_block_trains_like_eager():
    x = torch.randn(2, 3, 16)
    grads = []
    for compile_it in (False, True):
        torch.manual_seed(0)
        block = Block(16)
        inner = kiln.compile(block, backend="aot_eager") if compile_it else block
        wrapped = checkpoint_wrapper(inner)
        for _ in range(2):
            loss = F.mse_loss(wrapped(x), torch.ones_like(x))
            loss.backward()
        grads.append([p.grad.clone() for p in block.parameters()])
        if compile_it:
            assert inner._kiln_compiled.graph_modules
            # the wrapper's state dict has the original's keys (checkpoint_wrapper strips its own)
            assert list(wrapped.state_dict()) == list(Block(16).state_dict())
    for g, h in zip(*grads):
        torch.testing.assert_close(g, h)


def test_state_dict_hooks_on_the_wrapper_and_the_original_run():
    net = make_net()
    block = net.layers[1]
    net.layers[1] = compiled = kiln.compile(block, backend="eager")
    seen = []
    compiled.register_state_dict_pre_hook(lambda m, prefix, keep: seen.append(("pre", prefix)))
    compiled._register_state_dict_hook(lambda m, sd, prefix, meta: seen.append(("post", prefix)))
    block._register_state_dict_hook(lambda m, sd, prefix, meta: seen.append(("orig", prefix)))
    loaded = []
    compiled.register_load_state_dict_post_hook(lambda m, keys: loaded.append(m))
    sd = net.state_dict()
    assert ("pre", "layers.1.") in seen and ("post", "layers.1.") in seen
    assert ("orig", "layers.1.") in seen
    assert list(sd) == list(make_net().state_dict())
    seen.clear()
    compiled.state_dict()
    assert seen and all(prefix == "" for _, prefix in seen)
    new = {k: torch.randn_like(v) for k, v in sd.items()}
    net.load_state_dict(new)
    assert loaded
    torch.testing.assert_close(block.fc1.weight, new["layers.1.fc1.weight"])


def test_batchnorm_state_dict_version_is_the_originals():
    bn = nn.BatchNorm1d(4)
    compiled = kiln.compile(bn, backend="eager")
    assert (
        compiled.state_dict()._metadata[""]["version"] == bn.state_dict()._metadata[""]["version"]
    )
