"""Per-call cost of a dynamic entry against a static one: guards, AOT key and dispatch.

Compiles the same small program twice with kiln's default backend, once with `dynamic=False`
(an entry for one size) and once as users get a dynamic entry (`dynamic=None`: the second size
makes the changing dimension symbolic; `--dynamic-true` marks every dimension of every input
instead): capture's shape guards, AOT autograd's entry and guard check, and, while the code
generator declines symbolic sizes, the per-size table of backends/specialize.py. Warms both at
the sizes timed,
and times calls on tiny tensors, where the kernels cost little and the per-call machinery
dominates. Prints one line per program: the static and dynamic entries' time per call and
their difference (the target: within 10 us).

    PYTHONPATH=src python3 benchmarks/dynamic_overhead.py [--calls 20000] [--repeats 7]
        [--dynamic-true]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import kiln

CHUNK = 250  # calls timed in one go


def one_input(x, w, b):
    return torch.relu(x * w + b)


def ten_inputs(x, *ws):
    y = x
    for w in ws:
        y = y * w + 1.0
    return y


def _per_call_us(fn, args, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e6


def measure(name: str, program, make_args, sizes, calls: int, repeats: int, dyn) -> str:
    static = kiln.compile(program, dynamic=False)
    dynamic = kiln.compile(program, dynamic=dyn)
    fixed = make_args(sizes[0])
    with torch.no_grad():
        for _ in range(3):  # trace, compile and warm every size timed
            static(*fixed)
            for n in sizes:
                dynamic(*make_args(n))
        dyn_args = [make_args(n) for n in sizes]
        cycled = [dyn_args[k % len(dyn_args)] for k in range(CHUNK)]
        s_times, same_times, d_times = [], [], []
        # interleaved in short chunks, medians over many: a load from other processes that
        # comes and goes then hits the three alike instead of whichever ran at the time
        for _ in range(repeats * max(1, calls // CHUNK)):
            s_times.append(_per_call_us(static, fixed, CHUNK))
            # the dynamic entry at the static entry's size: the per-call machinery alone
            same_times.append(_per_call_us(dynamic, fixed, CHUNK))
            # and seeing a new size each call (all compiled): its real use
            start = time.perf_counter()
            for a in cycled:
                dynamic(*a)
            d_times.append((time.perf_counter() - start) / CHUNK * 1e6)
    s, same, d = (statistics.median(t) for t in (s_times, same_times, d_times))
    return (
        f"{name}: static entry {s:.2f} us/call; dynamic entry (dynamic={dyn}) at the same size "
        f"{same:.2f} us/call ({same - s:+.2f} us), cycling sizes {sizes} {d:.2f} us/call"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dynamic-true", action="store_true")
    args = parser.parse_args()
    dyn = True if args.dynamic_true else None
    torch.set_num_threads(1)
    w, b = torch.randn(8), torch.randn(8)
    print(
        measure(
            "x * w + b, 3 inputs",
            one_input,
            lambda n: (torch.randn(n, 8), w, b),
            [4, 6, 9],
            args.calls,
            args.repeats,
            dyn,
        )
    )
    ws = [torch.randn(8) for _ in range(9)]
    print(
        measure(
            "9 multiply-adds, 10 inputs",
            ten_inputs,
            lambda n: (torch.randn(n, 8), *ws),
            [4, 6, 9],
            args.calls,
            args.repeats,
            dyn,
        )
    )


if __name__ == "__main__":
    main()
