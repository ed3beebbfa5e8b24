"""The first minute of a program that uses kiln: is its other work slowed by kiln's own builds?

On a fresh machine kiln builds its native module (g++, in the background, at nice 19) and
compiles the user's function (in the foreground, on its first call). This measures what that
costs the rest of the program: each variant runs in a fresh process with empty kiln, Inductor
and Triton caches and an empty native-module folder, and times an eager PyTorch model (a small
transformer: the user's uncompiled work) back to back for `--seconds` seconds.

- `eager`: kiln is not imported.
- `kiln`: kiln is imported and a separate function is compiled and called once before the
  timing starts, so its native build is still running while the eager model is timed.

Printed per variant: calls made, median and 90th-percentile ms a call over the whole window
and over its first 10 s, and the ratio kiln / eager of the medians. Variants alternate over
`--repeat` rounds, so a change of machine load weighs on both.

    PYTHONPATH=src python3 benchmarks/first_minute.py --seconds 60 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(variant: str, seconds: float) -> dict:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True).eval()
    x = torch.randn(8, 128, 256)
    started = time.perf_counter()
    note = {}
    if variant == "kiln":
        import kiln

        def compiled_part(a, b):
            return torch.nn.functional.gelu(a @ b).softmax(-1).sum(0)

        fn = kiln.compile(compiled_part)
        a, b = torch.randn(64, 64), torch.randn(64, 64)
        got = fn(a, b)
        torch.testing.assert_close(got, compiled_part(a, b))
        from kiln import native

        note = {"native_status_after_compile": native.status()[0]}
    note["setup_s"] = round(time.perf_counter() - started, 3)
    times, stamps = [], []
    t0 = time.perf_counter()
    with torch.no_grad():
        while time.perf_counter() - t0 < seconds:
            begin = time.perf_counter()
            layer(x)
            end = time.perf_counter()
            times.append((end - begin) * 1e3)
            stamps.append(begin - t0)
    if variant == "kiln":
        from kiln import native

        note["native_status_at_end"] = native.status()[0]
    early = [t for t, s in zip(times, stamps) if s < 10.0]
    return {
        "variant": variant,
        "calls": len(times),
        "median_ms": statistics.median(times),
        "p90_ms": sorted(times)[int(0.9 * (len(times) - 1))],
        "first10s_median_ms": statistics.median(early) if early else None,
        "first10s_p90_ms": sorted(early)[int(0.9 * (len(early) - 1))] if early else None,
        **note,
    }


def run(variant: str, seconds: float) -> dict:
    from kiln.bench.worker import fresh_cache_env

    with tempfile.TemporaryDirectory(prefix="kiln-first-minute-") as root:
        env = fresh_cache_env(root)
        env["KILN_NATIVE_DIR"] = os.path.join(root, "native")  # the native module built anew
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(HERE, "..", "src"), env.get("PYTHONPATH", "")]
        )
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            variant,
            "--seconds",
            str(seconds),
        ]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    return {"variant": variant, "error": out.stderr[-1500:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default=None, help="JSON file")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args.seconds)), flush=True)
        return
    rows = []
    for _ in range(args.repeat):
        for variant in ("eager", "kiln"):
            rows.append(run(variant, args.seconds))
            print(json.dumps(rows[-1]), flush=True)
    for key in ("median_ms", "first10s_median_ms"):
        med = {v: statistics.median(r[key] for r in rows if r["variant"] == v and key in r)
               for v in ("eager", "kiln")}  # fmt: skip
        print(f"{key}: eager {med['eager']:.3f}, kiln {med['kiln']:.3f}, kiln/eager "
              f"{med['kiln'] / med['eager']:.3f}")  # fmt: skip
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "loadavg": load}, f, indent=1)


if __name__ == "__main__":
    main()
