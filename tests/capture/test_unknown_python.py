"""On a Python whose bytecode kiln does not know, `import kiln` works and compiled code runs
eagerly with one warning (fullgraph=True is an error), instead of an error at import.

A fresh interpreter is told it is Python 3.14 (sys.version_info, which capture/bytecode.py
reads once at import) before it imports kiln; its real opcodes stay this Python's.
"""

from __future__ import annotations

import os
import subprocess
import sys

_PROGRAM = r"""
import collections, sys, warnings
import torch

real = sys.version_info
V = collections.namedtuple("version_info", "major minor micro releaselevel serial")
sys.version_info = V(3, 14, 0, "final", 0)
with warnings.catch_warnings(record=True) as at_import:
    warnings.simplefilter("always")
    import kiln
sys.version_info = real
assert not at_import, [str(w.message) for w in at_import]

def f(x, y):
    return torch.relu(x) * y + x.sum()

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cf = kiln.compile(f)
    mod = kiln.compile(torch.nn.Linear(4, 3))
    for _ in range(3):
        x, y = torch.randn(4), torch.randn(4)
        torch.testing.assert_close(cf(x, y), f(x, y))
        torch.testing.assert_close(mod(x), mod.weight @ x + mod.bias)
    assert isinstance(mod, torch.nn.Module)
texts = [str(w.message) for w in caught]
assert len(texts) == 1, texts
assert "3.14" in texts[0] and "eagerly" in texts[0], texts[0]
assert caught[0].filename == "<string>", caught[0].filename  # the user's line
try:
    kiln.compile(f, fullgraph=True)
except RuntimeError as e:
    assert "3.14" in str(e), e
else:
    raise AssertionError("fullgraph=True compiled on an unknown Python")
print("OK")
"""


def test_unknown_python_imports_and_runs_eagerly_with_one_warning():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run(
        [sys.executable, "-c", _PROGRAM], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr
