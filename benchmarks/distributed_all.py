"""Every compiler x wrapping of benchmarks/distributed.py on N processes: one JSON, one table.

    python benchmarks/distributed_all.py --nproc 2 --out-dir benchmarks/results/distributed_2gpu
    python benchmarks/distributed_all.py --nproc 2 --tiny --out-dir /tmp/dist_smoke   # CPU

Runs `torchrun --standalone --nproc_per_node N benchmarks/distributed.py --compiler C --wrap W`
for C in eager, torch, kiln and W in ddp, fsdp (each in a fresh process group), then writes
`all.json` (every run's result, or its failure and the end of its output) and `table.md`
(variants left out with --compilers/--wraps are taken from an earlier run's `C_W.json` in the
same folder, so a long sweep can be split over several invocations):
step time, tokens/s and peak memory per GPU, communication overlap, and how far each loss
curve is from eager's with the same wrapping (bf16 autocast: a few 1e-3 relative is noise).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
COMPILERS = ("eager", "torch", "kiln")
WRAPS = ("ddp", "fsdp")


def run_one(compiler, wrap, args) -> dict:
    out = os.path.join(args.out_dir, f"{compiler}_{wrap}.json")
    if os.path.exists(out):
        os.unlink(out)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={args.nproc}",
        os.path.join(HERE, "distributed.py"),
        "--compiler", compiler, "--wrap", wrap, "--out", out, *args.extra,
    ]  # fmt: skip
    if args.tiny:
        cmd.append("--tiny")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.join(HERE, "..", "src"), env.get("PYTHONPATH")) if p
    )
    print(f"== {compiler} / {wrap}: {' '.join(cmd)}", flush=True)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        log = proc.stdout + proc.stderr
        code = proc.returncode
    except subprocess.TimeoutExpired as e:
        log, code = f"timed out after {args.timeout} s\n{e.stdout or ''}{e.stderr or ''}", -1
    if code == 0 and os.path.exists(out):
        with open(out) as f:
            return json.load(f)
    print(log[-3000:], flush=True)
    return {"compiler": compiler, "wrap": wrap, "failed": f"exit {code}", "log_tail": log[-4000:]}


def _overlap(result) -> str:
    per = result.get("comm_overlap_per_gpu") or []
    if not per or per[0] == "n/a":
        return "n/a"
    parts = []
    for kind in ("allreduce", "reducescatter", "allgather"):
        fr = [r[kind]["overlapped"] for r in per if r.get(kind, {}).get("overlapped") is not None]
        if fr:
            parts.append(f"{kind} {100 * sum(fr) / len(fr):.0f}%")
    return ", ".join(parts) or "no comm kernels"


def _notes(r: dict) -> str:
    """kiln's counts (graphs, DDP pieces, captures and fallbacks after the first step) and the
    CPU-GPU synchronisations of one step."""
    notes = []
    k = r.get("kiln")
    if k:
        notes.append(f"kiln graphs {k['graphs']}, breaks {len(k['graph_breaks'])}")
        pieces = [s.split(" into ")[1].split(" pieces")[0] for s in k["splits"] if " into " in s]
        if pieces:
            notes.append(f"DDP pieces {'/'.join(pieces)}")
        after = k.get("after_first_step")
        if after:
            notes.append(f"after step 1: captures {after['captures']}, fb {after['fallbacks']}")
        if k["runs_eagerly"]:
            notes.append(f"eager: {'; '.join(k['runs_eagerly'])[:120]}")
    syncs = r.get("sync_points")
    if isinstance(syncs, dict):
        notes.append(f"syncs/step {sum(syncs.values())}")
    return ", ".join(notes)


def table(results: list[dict]) -> str:
    eager = {r["wrap"]: r for r in results if r["compiler"] == "eager" and "failed" not in r}
    rows = [
        "| variant | step ms | CPU ms | tokens/s/GPU | peak GiB/GPU | comm overlapped | "
        "final loss | max rel. loss diff vs eager | notes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        name = f"{r['compiler']} {r['wrap']}"
        if "failed" in r:
            rows.append(f"| {name} | — | — | — | — | — | — | — | failed ({r['failed']}) |")
            continue
        ref = eager.get(r["wrap"])
        diff = "—"
        if ref is not None and r is not ref:
            diff = f"{max(abs(a - b) / abs(b) for a, b in zip(r['losses'], ref['losses'])):.2e}"
        peak = r["peak_mem_gib_per_gpu"]
        peak_s = "n/a" if peak[0] == "n/a" else f"{max(peak):.2f}"
        notes = _notes(r)
        cpu = r.get("cpu_issue_ms_median")
        cpu_s = "—" if cpu is None else f"{cpu:.1f}"
        rows.append(
            f"| {name} | {r['step_ms_median']:.1f} | {cpu_s} | {r['tokens_per_s_per_gpu']:.0f} "
            f"| {peak_s} | {_overlap(r)} | {r['losses'][-1]:.4f} | {diff} | {notes} |"
        )
    first = next((r for r in results if "failed" not in r), None)
    head = ""
    if first:
        head = (
            f"{first['model']}, {first['world_size']} x {first['device']} ({first['backend']}), "
            f"batch {first['batch_per_gpu']} x {first['seq']} per GPU, {first['steps']} steps, "
            f"torch {first['torch']}\n\n"
        )
    return head + "\n".join(rows) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--compilers", default=",".join(COMPILERS))
    p.add_argument("--wraps", default=",".join(WRAPS))
    p.add_argument("--timeout", type=float, default=1200)
    p.add_argument("extra", nargs="*", help="passed on to distributed.py (after --)")
    args = p.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    wanted = {(c, w) for c in args.compilers.split(",") for w in args.wraps.split(",")}
    results = []
    for w in WRAPS:
        for c in COMPILERS:
            if (c, w) in wanted:
                results.append(run_one(c, w, args))
                continue
            earlier = os.path.join(args.out_dir, f"{c}_{w}.json")
            if os.path.exists(earlier):  # a variant run by an earlier invocation: in the table
                with open(earlier) as f:
                    results.append(json.load(f))
    with open(os.path.join(args.out_dir, "all.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = table(results)
    with open(os.path.join(args.out_dir, "table.md"), "w") as f:
        f.write(md)
    print(md)
    return 0 if all("failed" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
