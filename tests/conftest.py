"""Suite-wide test setup.

Triton reads `TRITON_INTERPRET` when it is first imported (its own library functions are
decorated then), and any test may import it first (torch.compile does, in interop and
benchmark tests). So the interpreter switch is set here, before collection starts: a default
run (`-m 'not gpu'`, what CI runs) executes generated Triton kernels on CPU tensors in Triton's
interpreter; `pytest -m gpu ...` on the GPU machine compiles them for the GPU.
"""

from __future__ import annotations

import os


def pytest_configure(config):
    markexpr = config.getoption("markexpr", "") or ""
    gpu_run = "gpu" in markexpr and "not gpu" not in markexpr
    if not gpu_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
