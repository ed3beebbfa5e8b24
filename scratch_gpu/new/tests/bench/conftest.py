"""Shared set-up of the bench tests: one torch thread while a test runs in-process.

The tiny models here gain nothing from threads, and on a small shared machine two OpenMP
threads waiting on each other make every call slow; the previous setting is restored after.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
