"""Traces the report tests render: a program with graph breaks and recompiles, and the
nanoGPT training step of the benchmark suite (tiny size), each checked against eager."""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch

import kiln

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "trace"))
from test_trace import run_program  # noqa: E402


@pytest.fixture(scope="session")
def breaks_trace(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("breaks_trace"))
    run_program(folder)
    return folder


@pytest.fixture(scope="session")
def nanogpt_trace(tmp_path_factory) -> str:
    from kiln.bench.suite import load_models, models_dir

    folder = str(tmp_path_factory.mktemp("nanogpt_trace"))
    spec = load_models(models_dir())["nanogpt"]
    model, (idx,) = spec.factory(size="tiny", seed=1)
    model.train()
    eager = copy.deepcopy(model)
    compiled = kiln.compile(model, options={"trace.enabled": True, "trace.dir": folder})
    for step in range(2):  # a training step: forward, backward with random output gradients
        idx = spec.inputs(size="tiny", seed=10 + step)[0]
        for m in (model, eager):
            m.zero_grad(set_to_none=True)
        out_c, out_e = compiled(idx), eager(idx)
        torch.testing.assert_close(out_c, out_e, rtol=1e-4, atol=1e-4)
        grad = torch.randn_like(out_e)
        out_c.backward(grad)
        out_e.backward(grad)
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)
    return folder
