"""Kernels whose code differs only in names are defined and compiled once (renderer.py
`_canonical`, `TritonModule.same_as`): a two-layer network's layer-norm kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tr_helpers import TRITON_PROBLEM, check

pytestmark = pytest.mark.skipif(bool(TRITON_PROBLEM), reason=TRITON_PROBLEM or "")


def _two_layers(x, w1, w2, g1, b1, g2, b2):
    h = torch.relu(F.layer_norm(x @ w1, (64,), g1, b1))
    return (torch.relu(F.layer_norm(h @ w2, (64,), g2, b2)),)


def _inputs():
    return (
        [torch.randn(8, 64)]
        + [torch.randn(64, 64) / 8 for _ in range(2)]
        + [torch.randn(64) for _ in range(4)]
    )


def test_layers_share_one_kernel_definition():
    compiled = check(_two_layers, *_inputs())
    src = compiled.triton_source
    aliases = [line for line in src.splitlines() if "# the same code as" in line]
    assert len(aliases) == 1, src
    alias, original = aliases[0].split(" = ")[0], aliases[0].split(" = ")[1].split()[0]
    assert f"def {alias}(" not in src and f"def {original}(" in src
    assert f"{alias}[" in compiled.wrapper_source  # launched under its own name, same code


def test_different_code_is_not_merged():
    def f(x, w1, w2, g1, b1, g2, b2):
        h = F.layer_norm(x @ w1, (64,), g1, b1)
        return (torch.sigmoid(h) @ w2 * 3,)

    compiled = check(f, *_inputs())
    assert "# the same code as" not in compiled.triton_source
