"""A graph compiled inside DistributedDataParallel's forward is split at DDP's bucket boundaries
(backends/ddp_split.py), 2 processes on gloo: one compiled backward node per bucket, buckets
all-reduced while the backward of earlier pieces still has to run, in bucket order, and the
same training as eager; `optimize_ddp=False` keeps one graph."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from dist_harness import spawn
from torch.nn.parallel import DistributedDataParallel as DDP
from training import assert_same_training, batches, make_net

import kiln

CAP_MB = 0.01  # about one Block (dim 32) of parameters a bucket


def _ddp(world: int, events: list) -> DDP:
    ddp = DDP(make_net(dim=32, depth=3), bucket_cap_mb=CAP_MB)
    names = {id(p): n for n, p in ddp.module.named_parameters()}

    def allreduce(state, bucket):  # DDP's default hook (mean over ranks), recording the bucket
        events.append(("allreduce", bucket.index(), [names[id(p)] for p in bucket.parameters()]))
        work = dist.all_reduce(bucket.buffer() / world, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    ddp.register_comm_hook(None, allreduce)
    return ddp


def _compiled_nodes(loss: torch.Tensor) -> list:
    """kiln's backward nodes reachable from `loss` (one per compiled graph piece)."""
    found, stack, seen = [], [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "CompiledFunctionBackward":
            found.append(node)
        stack += [n for n, _ in node.next_functions]
    return found


def _train(model, ddp: DDP, data, events: list):
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    losses, pieces = [], []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        nodes = _compiled_nodes(loss)
        for k, node in enumerate(nodes):
            node.register_prehook(lambda *_, k=k: events.append(("backward", k)))
        pieces.append(len(nodes))
        events.append(("step",))
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), pieces


def _steps(events: list) -> list[list]:
    out: list[list] = []
    for e in events:
        if e[0] == "step":
            out.append([])
        else:
            out[-1].append(e)
    return out


def _bucket_split(rank, world):
    data = batches(rank)
    ref_events: list = []
    ref = _ddp(world, ref_events)
    ref_losses, _ = _train(ref, ref, data, ref_events)
    events: list = []
    ddp = _ddp(world, events)
    model = kiln.compile(ddp, backend="aot_eager")
    losses, pieces = _train(model, ddp, data, events)
    assert_same_training(losses, ref_losses, ddp.parameters(), ref.parameters())
    # the first call is the trace (eager's autograd); every later step runs the pieces
    assert pieces[0] == 0 and len(set(pieces[1:])) == 1 and pieces[1] >= 3, pieces
    for step in _steps(events)[1:]:
        backward = [i for i, e in enumerate(step) if e[0] == "backward"]
        reduced = [i for i, e in enumerate(step) if e[0] == "allreduce"]
        assert len(backward) == pieces[1], step
        # overlap: buckets are all-reduced while earlier pieces' backward still has to run
        assert reduced and reduced[0] < backward[-1], step
        between = [i for i in reduced if backward[0] < i < backward[-1]]
        assert len(between) >= pieces[1] - 1, step
        # and in DDP's bucket order, the bucket of the model's head first
        order = [step[i][1] for i in reduced]
        assert order == sorted(order), step
        assert any(n.startswith("head.") for n in step[reduced[0]][2]), step
    text = str(kiln.explain(_ddp(world, []))(data[0][0]))
    assert f"split at DistributedDataParallel's bucket boundaries into {pieces[1]} pieces" in (
        text
    ), text
    # optimize_ddp=False: one graph, one backward node, every bucket after it
    events.clear()
    ddp = _ddp(world, events)
    model = kiln.compile(ddp, backend="aot_eager", options={"optimize_ddp": False})
    losses, pieces = _train(model, ddp, data[:3], events)
    assert pieces[1:] == [1, 1], pieces
    torch.testing.assert_close(losses, ref_losses[:3], rtol=1e-4, atol=1e-5)


def _bucket_split_inductor_and_inside(rank, world):
    _bucket_split(rank, world)
    # DDP(kiln.compile(m)) with kiln's code generator: split the same way, trains as eager
    data = batches(rank)
    ref = _ddp(world, [])
    ref_losses, _ = _train(ref, ref, data, [])
    net = make_net(dim=32, depth=3)
    compiled = kiln.compile(net)
    events: list = []
    ddp = DDP(compiled, bucket_cap_mb=CAP_MB)
    losses, pieces = _train(ddp, ddp, data, events)
    assert_same_training(losses, ref_losses, net.parameters(), ref.parameters())
    assert pieces[1] >= 3, pieces


def test_graph_split_at_ddp_buckets_overlaps_allreduce_and_trains_like_eager():
    """kiln.compile(DDP(m)) on AOT autograd (event order), then DDP(kiln.compile(m)) with
    kiln's code generator (one spawn)."""
    spawn(_bucket_split_inductor_and_inside)
