"""DistributedDataParallel with kiln, 2 processes on gloo: both nestings train as eager does,
and no frame runs eagerly (dist_harness turns KilnEagerWarning into an error)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from dist_harness import spawn
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from training import assert_same_training, batches, make_net, train

import kiln


def _compile_of_ddp(rank, world):
    data = batches(rank)
    ref = DDP(make_net())
    ref_losses = train(ref, ref.parameters(), data)
    ddp = DDP(make_net())
    model = kiln.compile(ddp)
    losses = train(model, model.parameters(), data)
    assert_same_training(losses, ref_losses, ddp.parameters(), ref.parameters())
    inner = model._kiln_compiled
    assert inner.graph_modules and inner.eager_reason is None, "DDP's module was not compiled"
    text = str(kiln.explain(DDP(make_net()))(data[0][0]))
    assert "split: DistributedDataParallel.forward runs eagerly around its compiled module Net" in (
        text
    ), text
    assert "graphs: 1 " in text, text


def _compile_of_ddp_and_inside(rank, world):
    _compile_of_ddp(rank, world)
    _ddp_inside_compiled_step(rank, world)


def test_compile_of_ddp_compiles_the_module_and_trains_like_eager():
    """kiln.compile(DDP(m)), and a compiled function calling a DDP module (one spawn)."""
    spawn(_compile_of_ddp_and_inside)


def _ddp_of_compiled(rank, world):
    data = batches(rank)
    ref = DDP(make_net())
    ref_losses = train(ref, ref.parameters(), data)
    net = make_net()
    compiled = kiln.compile(net)
    model = DDP(compiled)
    losses = train(model, model.parameters(), data)
    assert_same_training(losses, ref_losses, net.parameters(), ref.parameters())
    assert compiled._kiln_compiled.graph_modules


def _ddp_of_compiled_and_options(rank, world):
    _ddp_of_compiled(rank, world)
    _ddp_options(rank, world)


def test_ddp_of_compiled_and_ddps_options_train_like_eager():
    """DDP(kiln.compile(m)); find_unused_parameters, static_graph, no_sync (one spawn)."""
    spawn(_ddp_of_compiled_and_options)


class Branchy(nn.Module):
    """A parameter the forward does not use on some steps (find_unused_parameters)."""

    def __init__(self):
        super().__init__()
        self.net = make_net()
        self.extra = nn.Linear(8, 8)

    def forward(self, x, use_extra: bool):
        y = self.net(x)
        return self.extra(y) if use_extra else y


def _ddp_options(rank, world):
    data = batches(rank)
    # find_unused_parameters: steps alternate between using `extra` and not
    for backend in ("aot_eager",):
        models = []
        for compiled in (False, True):
            torch.manual_seed(0)
            m = DDP(Branchy(), find_unused_parameters=True)
            models.append((kiln.compile(m, backend=backend) if compiled else m, m))
        results = []
        for model, ddp in models:
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            losses = []
            for i, (x, y) in enumerate(data):
                opt.zero_grad()
                loss = F.mse_loss(model(x, i % 2 == 0), y)
                loss.backward()
                opt.step()
                losses.append(loss.detach())
            results.append((torch.stack(losses), list(ddp.parameters())))
        assert_same_training(results[1][0], results[0][0], results[1][1], results[0][1])
    # static_graph: the reducer learns the graph on the first step
    ref = DDP(make_net(), static_graph=True)
    ref_losses = train(ref, ref.parameters(), data)
    ddp = DDP(make_net(), static_graph=True)
    model = kiln.compile(ddp, backend="aot_eager")
    losses = train(model, model.parameters(), data)
    assert_same_training(losses, ref_losses, ddp.parameters(), ref.parameters())
    # gradient accumulation under no_sync(): two micro-batches a step, the first without
    # all-reduce (eager DDP forbids no_sync with static_graph on the first step)
    results = []
    for compiled in (False, True):
        ddp = DDP(make_net())
        model = kiln.compile(ddp, backend="aot_eager") if compiled else ddp
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        losses = []
        for i in range(0, len(data) - 1, 2):
            opt.zero_grad()
            with model.no_sync():
                F.mse_loss(model(data[i][0]), data[i][1]).backward()
            loss = F.mse_loss(model(data[i + 1][0]), data[i + 1][1])
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        results.append((torch.stack(losses), list(ddp.parameters())))
    assert_same_training(results[1][0], results[0][0], results[1][1], results[0][1])


def _ddp_inside_compiled_step(rank, world):
    data = batches(rank)
    ref = DDP(make_net())
    ref_losses = train(ref, ref.parameters(), data)
    ddp = DDP(make_net())

    @kiln.compile(backend="aot_eager")
    def loss_of(x, y):
        return F.mse_loss(ddp(x) * 1.0, y)

    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    assert_same_training(torch.stack(losses), ref_losses, ddp.parameters(), ref.parameters())
    report = kiln.explain(loss_of)
    cf = loss_of._kiln_compiled
    assert cf.nested and cf.nested[0].graph_modules, "DDP's module inside was not compiled"
    assert any("DistributedDataParallel.forward runs eagerly" in r for r, _, _ in cf.breaks)
    del report
