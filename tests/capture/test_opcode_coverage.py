"""Every opcode this Python's compiler emits has a handler in kiln's interpreter, or is one
kiln declines for a stated reason (bytecode.NOT_RUN); a declined one is a reported eager
fallback, and an error under fullgraph=True.
"""

from __future__ import annotations

import dis

import pytest
import torch
from harness import assert_same

import kiln
from kiln.capture import bytecode
from kiln.capture.errors import Unsupported

_SPECIALIZED = set(getattr(dis, "_specialized_opmap", {})) | set(
    getattr(dis, "_specializations", {})
)


def test_every_opcode_has_a_handler_or_a_stated_reason():
    real = {
        name
        for name, op in dis.opmap.items()
        if op < 256  # 3.12+ list pseudo-instructions of the compiler above 255
        and not name.startswith("INSTRUMENTED_")
        and name not in _SPECIALIZED
    }
    missing = {name for name in real if bytecode.handler(name) is None}
    assert missing == {name for name in bytecode.NOT_RUN if name in dis.opmap}


def _except_star(x):
    try:
        raise ExceptionGroup("g", [ValueError("v"), KeyError("k")])
    except* ValueError:
        x = x + 1
    except* KeyError:
        x = x * 2
    return x.sin()


def test_a_declined_opcode_runs_eagerly_with_its_reason():
    cf = kiln.compile(_except_star, backend="eager")
    for _ in range(2):
        x = torch.randn(4)
        assert_same(cf(x.clone()), _except_star(x.clone()))
    reason = cf._kiln_compiled.eager_reason
    assert reason and "except*" in reason and "test_opcode_coverage.py" in reason, reason


def test_a_declined_opcode_under_fullgraph_is_an_error():
    cf = kiln.compile(_except_star, backend="eager", fullgraph=True)
    with pytest.raises(Unsupported, match=r"except\*.*test_opcode_coverage.py:\d+"):
        cf(torch.randn(4))
