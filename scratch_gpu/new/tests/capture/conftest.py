import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import kiln  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_state():
    torch.manual_seed(1234)
    yield
    kiln.reset()
