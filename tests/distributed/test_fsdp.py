"""FSDP2 (`fully_shard`) with kiln, 2 processes on gloo: blocks compiled then sharded (the
torchtitan recipe), blocks sharded then compiled, and the whole sharded model compiled, with
and without a bf16 mixed-precision policy; each trains as its eager twin does."""

from __future__ import annotations

import torch
from dist_harness import spawn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from training import assert_same_training, batches, make_net, train

import kiln


def _full(params):
    return [p.full_tensor() if hasattr(p, "full_tensor") else p for p in params]


def _sharded(recipe: str, compiled: bool, mp: MixedPrecisionPolicy | None, backend: str):
    net = make_net(depth=3)
    kw = {"mp_policy": mp} if mp is not None else {}
    blocks = []
    for i, block in enumerate(net.layers):
        if recipe == "compile_then_shard":
            block = kiln.compile(block, backend=backend) if compiled else block
            fully_shard(block, **kw)
        elif recipe == "shard_then_compile":
            fully_shard(block, **kw)
            block = kiln.compile(block, backend=backend) if compiled else block
        else:  # "whole": blocks sharded, the whole model compiled below
            fully_shard(block, **kw)
        net.layers[i] = block
        blocks.append(block)
    fully_shard(net, **kw)
    model = kiln.compile(net, backend=backend) if compiled and recipe == "whole" else net
    return net, model, blocks


def _fsdp(rank, world, recipe, mixed, backend):
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mp = mp if mixed else None
    data = batches(rank)
    ref, _, _ = _sharded(recipe, False, mp, backend)
    ref_losses = train(ref, ref.parameters(), data)
    net, model, blocks = _sharded(recipe, True, mp, backend)
    losses = train(model, model.parameters(), data)
    tol = {"rtol": 2e-2, "atol": 2e-3} if mixed else {}
    assert_same_training(
        losses.float(), ref_losses.float(), _full(net.parameters()), _full(ref.parameters()), **tol
    )
    compiled = [model] if recipe == "whole" else blocks
    for c in compiled:
        cf = c._kiln_compiled
        units = [cf, *cf.continuations.values()]
        assert sum(len(u.graph_modules) for u in units) > 0, "nothing was compiled"
        assert all(u.eager_reason is None for u in units)


def _torchtitan(rank, world):
    _fsdp(rank, world, "compile_then_shard", False, "inductor")
    _fsdp(rank, world, "compile_then_shard", True, "inductor")


def test_fsdp2_blocks_compiled_then_sharded_with_and_without_bf16_policy():
    """The torchtitan recipe, with kiln's code generator; then with MixedPrecisionPolicy
    (bf16 parameters, fp32 gradient reduction)."""
    spawn(_torchtitan)


def _other_orders(rank, world):
    # these check the hooks and graph splits: kiln's capture and AOT autograd suffice
    _fsdp(rank, world, "shard_then_compile", False, "aot_eager")
    _fsdp(rank, world, "whole", False, "aot_eager")


def test_fsdp2_blocks_sharded_then_compiled_and_whole_model_compiled():
    spawn(_other_orders)
