"""Native bound launches against Python launches, in one process (GPU).

Builds `MODELS[name]` (benchmarks/models, size "large", bfloat16, CUDA), compiles it with kiln,
and times the CPU of one call (median of 100 calls, each started on an idle device) in 6 rounds,
each round timing the call with every kernel's grid entry set to its native `BoundLaunch`
(runtime/triton_launch.py, native_launch.cpp) and with every entry set back to the Python
`_Launch`, in alternating order, plus eager. Prints the median and the best round of each.

Usage: PYTHONPATH=src python3 benchmarks/gpu_launch_ab.py [MODEL]   (default tv_resnet50)
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_call_layers import cpu_us, fast_kernels  # noqa: E402
from gpu_compare import model  # noqa: E402


def main() -> None:
    import kiln

    name = sys.argv[1] if len(sys.argv) > 1 else "tv_resnet50"
    m, inputs = model(name)
    with torch.no_grad():
        k = kiln.compile(m)
        for _ in range(5):
            k(*inputs)
        entries = [(fk, g, fk[g]) for fk in fast_kernels() for g in list(fk)]
        bound = sum(type(v).__name__ == "BoundLaunch" for _, _, v in entries)

        def use(kind: str) -> None:
            for fk, g, v in entries:
                fk[g] = v if kind == "bound" else fk._launches[g]

        times: dict[str, list[float]] = {"python": [], "bound": [], "eager": []}
        for r in range(6):
            for kind in ("python", "bound") if r % 2 == 0 else ("bound", "python"):
                use(kind)
                k(*inputs)
                times[kind].append(cpu_us(lambda: k(*inputs), 100))
            times["eager"].append(cpu_us(lambda: m(*inputs), 30))
        use("bound")
    shown = ", ".join(
        f"{kind} {statistics.median(v):.0f} (best {min(v):.0f})" for kind, v in times.items()
    )
    print(f"{name}: {bound} of {len(entries)} launches bound; CPU us per call, 6 rounds: {shown}")


if __name__ == "__main__":
    main()
