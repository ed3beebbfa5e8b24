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


# A function with an opcode kiln declines: on 3.12+, a PEP 695 type parameter with a bound
# (CPython evaluates it lazily, which no public constructor can); 3.11's synchronous functions
# contain no declined opcode.
_DECLINED_SOURCE = """
def declined(x):
    class Num[N: float]:
        pass

    return x.sin() + len(Num.__type_params__)
"""
needs_declined = pytest.mark.skipif(
    bytecode.PY < (3, 12), reason="every opcode of a 3.11 function has a handler"
)


def _declined():
    scope: dict = {}
    exec(compile(_DECLINED_SOURCE, __file__, "exec"), scope)
    return scope["declined"]


@needs_declined
def test_a_declined_opcode_runs_eagerly_with_its_reason():
    fn = _declined()
    cf = kiln.compile(fn, backend="eager")
    for _ in range(2):
        x = torch.randn(4)
        assert_same(cf(x.clone()), fn(x.clone()))
    reason = cf._kiln_compiled.eager_reason
    assert reason and "WITH_BOUND" in reason and "test_opcode_coverage.py" in reason, reason


@needs_declined
def test_a_declined_opcode_under_fullgraph_is_an_error():
    cf = kiln.compile(_declined(), backend="eager", fullgraph=True)
    with pytest.raises(Unsupported, match=r"WITH_BOUND.*test_opcode_coverage.py:\d+"):
        cf(torch.randn(4))
