"""The rewrites' tests compile through the C++ and Triton helpers of tests/codegen."""

import sys
from pathlib import Path

_CODEGEN = Path(__file__).resolve().parents[1] / "codegen"
for folder in (_CODEGEN, _CODEGEN / "triton"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
