"""An entry reads each guarded value once per call: a value its checks read several times
(a tensor's type, dtype, device, sizes, strides, requires_grad) or reach through another
guarded value (`self.state[p]['exp_avg']` after `self.state[p]`) is bound to a local on its
first read, and the graph's inputs are those locals. An optimizer step's guards hashed each
parameter (Tensor.__hash__, a Python function) about twenty times a call, one dict lookup per
read of a state tensor; results stay eager's."""

from __future__ import annotations

from unittest import mock

import torch

import kiln


def test_optimizer_step_hashes_each_parameter_a_few_times_a_call():
    torch.manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(4, 3)) for _ in range(6)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = torch.optim.Adam(params, lr=0.1, foreach=True)
    ref_opt = torch.optim.Adam(ref, lr=0.1, foreach=True)
    step = kiln.compile(opt.step)
    hashes = []
    real_hash = torch.Tensor.__hash__
    for _ in range(4):
        for p, r in zip(params, ref):
            g = torch.randn_like(p)
            p.grad, r.grad = g.clone(), g.clone()
        with mock.patch("torch.compiler.is_compiling", return_value=True):
            ref_opt.step()
        count = [0]

        def counting(t, count=count):
            count[0] += 1
            return real_hash(t)

        with mock.patch.object(torch.Tensor, "__hash__", counting):
            step()
        hashes.append(count[0])
        for p, r in zip(params, ref):
            torch.testing.assert_close(p, r)
    # steady state (calls 3 and 4): each `self.state[p]` is looked up by its guard, once
    assert max(hashes[2:]) <= 2 * len(params), hashes
