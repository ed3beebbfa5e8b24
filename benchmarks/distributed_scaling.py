"""Scaling efficiency of benchmarks/distributed.py from sweeps at several process counts.

    python benchmarks/distributed_scaling.py DIR_N1 DIR_N2 DIR_N4 [--out scaling.md]

Each DIR is the `--out-dir` of one `benchmarks/distributed_all.py --nproc N` sweep on the same
machine (its `all.json`). For every compiler x wrapping the table gives tokens/s per GPU at each
process count and the scaling efficiency against the smallest count: tokens/s per GPU at N over
tokens/s per GPU at the smallest N (1.0 = perfect weak scaling; the batch per GPU is fixed), and
at the largest N how each compiler compares with torch.compile under the same wrapping.
"""

from __future__ import annotations

import argparse
import json
import os


def _load(folder: str) -> tuple[int, dict]:
    with open(os.path.join(folder, "all.json")) as f:
        runs = json.load(f)
    ok = [r for r in runs if "failed" not in r]
    if not ok:
        raise SystemExit(f"{folder}/all.json has no successful run")
    world = ok[0]["world_size"]
    return world, {(r["compiler"], r["wrap"]): r for r in runs}


def table(sweeps: dict[int, dict]) -> str:
    worlds = sorted(sweeps)
    top = worlds[-1]
    variants = sorted({key for s in sweeps.values() for key in s}, key=lambda k: (k[1], k[0]))
    head = " | ".join(f"{n} GPU tok/s/GPU" for n in worlds)
    eff = " | ".join(f"eff. {n}" for n in worlds[1:])
    rows = [
        f"| variant | {head} | {eff} | vs torch.compile at {top} |",
        "| --- |" + " --- |" * (2 * len(worlds)),
    ]
    for compiler, wrap in variants:
        tps, cells = [], []
        for n in worlds:
            r = sweeps[n].get((compiler, wrap))
            ok = r is not None and "failed" not in r
            tps.append(r["tokens_per_s_per_gpu"] if ok else None)
            cells.append(f"{tps[-1]:,.0f}" if ok else ("not run" if r is None else "failed"))
        effs = [f"{t / tps[0]:.2f}" if t and tps[0] else "—" for t in tps[1:]]
        ref = sweeps[top].get(("torch", wrap))
        vs = "—"
        if tps[-1] and ref and "failed" not in ref and compiler != "torch":
            vs = f"{tps[-1] / ref['tokens_per_s_per_gpu']:.2f}x"
        rows.append(f"| {compiler} {wrap} | " + " | ".join(cells + effs) + f" | {vs} |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", help="distributed_all.py --out-dir folders")
    p.add_argument("--out", default=None, help="also write the table here")
    args = p.parse_args(argv)
    sweeps = dict(_load(d) for d in args.dirs)
    md = table(sweeps)
    print(md)
    if args.out:
        with open(args.out, "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
