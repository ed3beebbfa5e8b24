"""Triton tests run on the CPU through Triton's interpreter, unless the GPU tests are selected.

`TRITON_INTERPRET=1` has to be set before Triton is first imported, so it is set here, when
pytest configures itself, rather than in each module: a default run (`-m 'not gpu'`) runs the
generated kernels on CPU tensors in the interpreter, and `pytest -m gpu tests/codegen/triton`
on the GPU machine compiles them for the GPU instead.
"""

from __future__ import annotations

import os


def pytest_configure(config):
    markexpr = config.getoption("markexpr", "") or ""
    gpu_run = "gpu" in markexpr and "not gpu" not in markexpr
    if not gpu_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
