"""Differential fuzzing at scale: random programs compiled with kiln against eager PyTorch.

    PYTHONPATH=src python3 benchmarks/fuzz.py --count 10000 [--start 0] [--backend eager]
        [--inductor-every 10] [--out benchmarks/results/fuzz.json] [--show 5] [--jobs 1]

Runs programs `start .. start+count-1` (tests/fuzz/generator.py; a seed names one program)
with `--backend`, and every `--inductor-every`-th one also with kiln's default backend;
prints the mismatch count, the time taken and the source of the first failing programs, and
writes them as JSON to `--out`. Exit status 1 when any program mismatched.

`--jobs N` splits the seed range into N consecutive shards, each run by its own process (with
its own kiln cache folder and one OpenMP thread, so the shards do not share anything but the
machine), and merges their results: the same programs, in a fraction of the time on a machine
with N cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from fuzz.runner import run_program  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--backend", default="eager")
    p.add_argument("--inductor-every", type=int, default=10, help="0: never")
    p.add_argument("--out", default=None)
    p.add_argument("--show", type=int, default=3, help="failing programs to print in full")
    p.add_argument("--jobs", type=int, default=1, help="processes, each a shard of the seeds")
    args = p.parse_args(argv)
    if args.jobs > 1:
        return _run_sharded(args)
    t0 = time.perf_counter()
    failures = []
    runs = 0
    for seed in range(args.start, args.start + args.count):
        backends = [args.backend]
        if args.inductor_every and seed % args.inductor_every == 0:
            backends.append("inductor")
        for backend in backends:
            runs += 1
            try:
                found = run_program(seed, backend)
            except Exception as e:  # the harness itself failed: count it, keep going
                found = [f"harness error: {type(e).__name__}: {e}"]
            if found:
                failures.append((seed, backend, found[0]))
                what = found[0] if isinstance(found[0], str) else found[0].what
                print(f"MISMATCH seed {seed} {backend}: {what.splitlines()[0][:200]}", flush=True)
        if (seed - args.start + 1) % 500 == 0:
            print(
                f"... {seed - args.start + 1} programs, {len(failures)} mismatches, "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    elapsed = time.perf_counter() - t0
    print(
        f"\n{args.count} programs ({runs} compiled runs) in {elapsed:.0f} s: "
        f"{len(failures)} mismatches"
    )
    for _seed, _backend, m in failures[: args.show]:
        print("\n" + "=" * 100)
        print(m if isinstance(m, str) else m.describe())
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(
                {
                    "count": args.count,
                    "start": args.start,
                    "runs": runs,
                    "seconds": round(elapsed, 1),
                    "mismatches": [
                        {"seed": s, "backend": b, "what": m if isinstance(m, str) else m.what}
                        for s, b, m in failures
                    ],
                },
                f,
                indent=1,
            )
    return 1 if failures else 0


def _run_sharded(args) -> int:
    """Run the seed range as `args.jobs` shards in parallel processes; merge their JSON."""
    t0 = time.perf_counter()
    base, extra = divmod(args.count, args.jobs)
    work = tempfile.mkdtemp(prefix="kiln_fuzz_")
    procs, start = [], args.start
    for j in range(args.jobs):
        count = base + (1 if j < extra else 0)
        out = os.path.join(work, f"shard{j}.json")
        env = dict(os.environ, KILN_CACHE_DIR=os.path.join(work, f"cache{j}"), OMP_NUM_THREADS="1")
        cmd = [sys.executable, os.path.abspath(__file__), "--count", str(count), "--start",
               str(start), "--backend", args.backend, "--inductor-every",
               str(args.inductor_every), "--out", out, "--show", "0"]  # fmt: skip
        log = open(os.path.join(work, f"shard{j}.log"), "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), out))
        start += count
    runs, failures, missing = 0, [], []
    for proc, out in procs:
        proc.wait()
        if not os.path.exists(out):  # the shard itself died: its programs were not checked
            missing.append(out)
            continue
        with open(out) as f:
            shard = json.load(f)
        runs += shard["runs"]
        failures += shard["mismatches"]
    elapsed = time.perf_counter() - t0
    print(
        f"{args.count} programs ({runs} compiled runs) in {elapsed:.0f} s with {args.jobs} "
        f"processes: {len(failures)} mismatches"
        + (f"; {len(missing)} shards died (logs in {work})" if missing else "")
    )
    for m in failures:
        print(f"MISMATCH seed {m['seed']} {m['backend']}: {m['what'].splitlines()[0][:200]}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            summary = {"count": args.count, "start": args.start, "runs": runs,
                       "seconds": round(elapsed, 1), "jobs": args.jobs,
                       "shards_died": len(missing), "mismatches": failures}  # fmt: skip
            json.dump(summary, f, indent=1)
    return 1 if failures or missing else 0


if __name__ == "__main__":
    sys.exit(main())
