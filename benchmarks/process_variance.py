"""How fast one fresh process runs eager ResNet-50 (GPU): run it several times to see the spread.

Builds `tv_resnet50` (benchmarks/models, size "large", bfloat16, CUDA) and prints the median CPU
microseconds of one eager call started on an idle device (300 calls), with the process's pid
and CPU affinity. Run in a loop, each a fresh process, optionally under `taskset -c N` (pinned)
or `setarch $(uname -m) -R` (ASLR off), to see how much a process's speed is a draw (why
`kiln bench --processes N` exists).

Usage: for i in 1 2 3 4 5; do PYTHONPATH=src python3 benchmarks/process_variance.py; done
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_compare import call_us, model  # noqa: E402


def main() -> None:
    m, inputs = model("tv_resnet50")
    with torch.no_grad():
        for _ in range(20):
            m(*inputs)
        cpu, lat = call_us(m, inputs, n=300)
    cpus = sorted(os.sched_getaffinity(0))
    print(f"pid {os.getpid()} on {len(cpus)} CPUs (first {cpus[0]}): eager CPU us {cpu:.0f}, "
          f"latency us {lat:.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
