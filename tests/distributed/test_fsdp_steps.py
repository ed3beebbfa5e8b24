"""FSDP2 blocks compiled with kiln, step by step (2 processes on gloo): what each training step
costs kiln and whether FSDP's hooks still do their work around kiln's graphs.

Per step after the first: every block runs its compiled graph (one kiln backward node a block),
nothing is captured again, no guard fails, nothing falls back to eager; FSDP's hooks run in
eager's order (unshard/reshard around each forward and backward, reduce-scatter after each
backward); after the forward, the unsharded parameters are freed as in eager and kiln's
autograd nodes keep no more saved tensor bytes alive than eager's do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from dist_harness import spawn
from torch.distributed.fsdp import fully_shard
from training import STEPS, assert_same_training, batches, make_net

import kiln
from kiln.backends.builtin import fallbacks

HOOKS = ("pre_forward", "post_forward", "pre_backward", "post_backward", "unshard", "reshard")


def _record_hooks(events: list, numbers: dict) -> None:
    """Record every call of FSDP's per-group hooks as (hook, group number); groups are
    numbered in the order they are first met (`numbers`: id of a group -> its number)."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    for name in HOOKS:
        original = getattr(FSDPParamGroup, name)

        def recorded(self, *args, _name=name, _original=original, **kwargs):
            events.append((_name, numbers.setdefault(id(self), len(numbers))))
            return _original(self, *args, **kwargs)

        setattr(FSDPParamGroup, name, recorded)


def _build(compiled: bool):
    net = make_net(dim=32, depth=3)
    for i, block in enumerate(net.layers):
        block = kiln.compile(block) if compiled else block
        fully_shard(block)
        net.layers[i] = block
    fully_shard(net)
    return net


def _unsharded_storage(net) -> list[int]:
    """Bytes of each block's unsharded parameters' storage (0: resharded, freed)."""
    sizes = []
    for block in net.layers:
        group = block._get_fsdp_state()._fsdp_param_group
        for p in group.fsdp_params:
            unsharded = getattr(p, "_unsharded_param", None)
            sizes.append(0 if unsharded is None else unsharded.untyped_storage().nbytes())
    return sizes


def _kiln_nodes(loss) -> int:
    found, stack, seen = 0, [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        found += type(node).__name__ == "CompiledFunctionBackward"
        stack += [n for n, _ in node.next_functions]
    return found


def _train(net, data, events: list, numbers: dict) -> dict:
    numbers.clear()  # this model's groups numbered from 0, as the other model's were
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    out: dict = {"losses": [], "hooks": [], "nodes": [], "storage": [], "saved": []}
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        events.clear()
        saved: dict = {}

        def pack(t, saved=saved):
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = F.mse_loss(net(x), y)
        # what the saved tensors still hold once FSDP resharded (freed storages count 0)
        out["saved"].append(sum(s.nbytes() for s in saved.values()))
        out["storage"].append(_unsharded_storage(net))
        out["nodes"].append(_kiln_nodes(loss))
        loss.backward()
        opt.step()
        out["hooks"].append(list(events))
        out["losses"].append(loss.detach())
    out["losses"] = torch.stack(out["losses"])
    return out


def _full(params):
    return [p.full_tensor() for p in params]


def _steps(rank, world):
    events: list = []
    numbers: dict = {}
    _record_hooks(events, numbers)
    data = batches(rank)
    ref = _build(False)
    eager = _train(ref, data, events, numbers)
    net = _build(True)
    first_fallback = len(fallbacks())
    ran = _train(net, data, events, numbers)
    assert_same_training(
        ran["losses"], eager["losses"], _full(net.parameters()), _full(ref.parameters())
    )
    # every step after the first (the trace) runs each block's compiled graph
    assert ran["nodes"][1:] == [3] * (STEPS - 1), ran["nodes"]
    for block in net.layers:
        cf = block._kiln_compiled
        assert cf.compiles == 1 and len(cf.entries) == 1, (cf.label, cf.compiles)
        assert cf.eager_reason is None and not cf.continuations and not cf.breaks
    assert fallbacks()[first_fallback:] == []
    # FSDP's hooks fire in eager's order around kiln's forward and backward
    assert ran["hooks"] == eager["hooks"]
    assert {name for name, _ in ran["hooks"][-1]} == set(HOOKS)
    # resharded after the forward as in eager; no saved tensor keeps more memory alive
    assert ran["storage"] == eager["storage"], (ran["storage"], eager["storage"])
    for k in range(1, STEPS):
        assert ran["saved"][k] <= eager["saved"][k], (k, ran["saved"], eager["saved"])


def test_fsdp2_compiled_blocks_cost_no_recompile_fallback_or_memory_per_step():
    spawn(_steps)
