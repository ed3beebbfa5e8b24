"""Where a dynamic entry's time goes against a static one, call by call: each generated kernel,
extern (ATen) call and allocation of the transformer block of dynamic_lengths.py, timed inside
the wrapper.

kiln's C++ wrapper calls its kernels and extern ops through names in its namespace; this script
wraps each with a timer, for a dynamic entry (first built at untimed lengths, as
dynamic_lengths.py does) and an entry compiled for each length alone, calls the two alternately
and prints, per length, the median time per call of each name in call order and the sums of
the generated kernels (the part the code generator decides; extern calls run the same ATen
kernels in both entries). A loaded machine disturbs the sums far less than whole calls, whose
time is mostly the extern matrix products.

    PYTHONPATH=src python3 benchmarks/dynamic_kernels.py [--lengths 17,97,177] [--calls 40]
        [--threads 1]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-dynkern-"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from dynamic_lengths import BATCH, DIM, WARM_LENGTHS, Block  # noqa: E402

TIMED = ("kernel", "aten_", "_empty")  # wrapper names timed: kernels, extern ops, allocations


def _loaded_calls() -> list:
    """Patches the C++ loader so that every wrapper `call` it makes is kept (in order)."""
    import kiln.codegen.cpp.load as cpp_load

    made: list = []
    real = cpp_load.load

    def keep(data):
        call = real(data)
        made.append(call)
        return call

    cpp_load.load = keep
    return made


def _instrument(call, times: dict) -> None:
    """Wraps the kernels, extern ops and allocations `call` reaches through its namespace."""
    ns = call.__globals__
    for name, fn in list(ns.items()):
        if name.startswith(TIMED) and callable(fn):

            def timed(*a, _fn=fn, _name=name, **kw):
                start = time.perf_counter()
                out = _fn(*a, **kw)
                times[_name].append(time.perf_counter() - start)
                return out

            ns[name] = timed


def _per_call_us(times: dict, calls: int) -> dict:
    """{name: median over calls of the summed microseconds of that name within one call}."""
    out = {}
    for name, ts in times.items():
        per = len(ts) // calls
        out[name] = statistics.median(sum(ts[i * per : (i + 1) * per]) for i in range(calls)) * 1e6
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="17,97,177")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import kiln

    torch.set_num_threads(args.threads)
    made = _loaded_calls()
    torch.manual_seed(0)
    block = Block().eval()
    with torch.no_grad():
        dyn = kiln.compile(block)
        for u in WARM_LENGTHS:
            dyn(torch.randn(BATCH, u, DIM))
        # the first warm length's static entry, then the symbolic one every length runs
        assert len(made) == 2, f"{len(made)} graphs loaded by the dynamic entry"
        times = {"static": collections.defaultdict(list), "dynamic": collections.defaultdict(list)}
        _instrument(made[1], times["dynamic"])
        for t in map(int, args.lengths.split(",")):
            x = torch.randn(BATCH, t, DIM)
            static = kiln.compile(block, dynamic=False)
            static(x)
            times["static"] = collections.defaultdict(list)
            _instrument(made[-1], times["static"])
            for fn in (static, dyn):  # both right before timing
                torch.testing.assert_close(fn(x), block(x), rtol=1e-4, atol=1e-4)
            for times_of in times.values():
                times_of.clear()
            for r in range(args.calls):
                for fn in (static, dyn) if r % 2 else (dyn, static):
                    fn(x)
            sums = {}
            for which in ("static", "dynamic"):
                us = _per_call_us(times[which], args.calls)
                sums[which] = sum(v for k, v in us.items() if k.startswith("kernel"))
                cells = "  ".join(f"{k} {v:.1f}" for k, v in us.items())
                print(f"T={t:4d} {which:8s} us/call: {cells}")
            print(
                f"T={t:4d} generated kernels: dynamic {sums['dynamic']:.1f} us, static "
                f"{sums['static']:.1f} us, x{sums['dynamic'] / sums['static']:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
