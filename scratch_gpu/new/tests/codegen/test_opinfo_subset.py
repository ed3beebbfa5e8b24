"""A fast OpInfo subset: float32 CPU forward; each op's compiled graph must match eager.

Uses the sweep harness `benchmarks/opinfo_sweep.run_op` (the full sweep is that script). The
subset covers each lowering family; ops listed in LOWERED must also compile to C++ kernels
only (no extern call), so a lowering that silently starts falling back fails here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("expecttest", reason="torch's OpInfo database needs `expecttest`")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from opinfo_sweep import run_op  # noqa: E402

LOWERED = [
    "add",
    "mul",
    "div.floor_rounding",
    "exp",
    "sigmoid",
    "where",
    "clamp",
    "nn.functional.gelu",
    "sum",
    "mean",
    "amax",
    "argmax",
    "var",
    "softmax",
    "log_softmax",
    "nn.functional.layer_norm",
    "permute",
    "cat",
    "nn.functional.pad.constant",
    "max.reduction_with_dim",
    "remainder",
    "logsumexp",
    "nn.functional.embedding",
    "gather",
    "index_select",
    "take_along_dim",
]
EXTERN_OK = ["nn.functional.pad.reflect", "cumsum"]

_BY_NAME = {o.full_name: o for o in op_db}


@pytest.mark.parametrize("name", LOWERED + EXTERN_OK)
def test_op_matches_eager(name):
    opinfo = _BY_NAME[name]
    assert torch.float32 in opinfo.supported_dtypes("cpu")
    status, detail, lowered = run_op(opinfo, samples_per_op=3)
    assert status == "pass", detail
    if name in LOWERED:
        assert lowered, f"{name} fell back to an extern call"
