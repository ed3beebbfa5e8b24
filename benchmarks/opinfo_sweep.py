"""OpInfo sweep of kiln's C++ code generator: every op in PyTorch's `op_db`, float32, CPU, forward.

Takes op names (default: all of `op_db`); for each op, traces up to `--samples` of its sample
inputs into ONE ATen graph (`make_fx`), compiles it with `kiln.codegen.compile_graph_strict`,
and compares every output with eager on the same inputs. An op passes if the compiled graph
matches eager — whether kiln lowered it to a kernel or kept it as an `Extern` call. Ops whose
samples eager or `make_fx` cannot run are "skipped", not counted.

Usage:
    python benchmarks/opinfo_sweep.py                      # full sweep, prints a summary
    python benchmarks/opinfo_sweep.py --ops add,softmax    # some ops
    python benchmarks/opinfo_sweep.py --write benchmarks/results/opinfo_cpu.md

`tests/codegen/test_opinfo_subset.py` runs `run_op` on a small subset in CI.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import traceback

import torch
import torch.utils._pytree as pytree


def _samples(opinfo, limit: int):
    out = []
    try:
        gen = opinfo.sample_inputs("cpu", torch.float32, requires_grad=False)
        for s in gen:
            out.append(s)
            if len(out) >= limit:
                break
    except Exception:  # noqa: BLE001 - an OpInfo that cannot make samples is skipped
        return []
    return out


def _flatten(samples):
    """All tensors of all samples (graph inputs) and a function rebuilding calls from them."""
    structs, leaves = [], []
    for s in samples:
        flat, spec = pytree.tree_flatten((s.input, s.args, s.kwargs))
        idx = []
        for v in flat:
            if isinstance(v, torch.Tensor):
                idx.append(len(leaves))
                leaves.append(v)
            else:
                idx.append(None)
        structs.append((flat, spec, idx))
    return structs, leaves


def run_op(opinfo, samples_per_op: int = 4):
    """('pass'|'fail'|'skip'|'eager', detail, lowered: bool) for one OpInfo entry.

    'eager': the traced graph is not functional (in-place ops on views), so compile_graph hands
    it back to eager by design; counted apart from passes and failures."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.codegen import compile_graph_strict
    from kiln.lower import GraphUnsupported
    from kiln.lower.ir import Extern

    samples = _samples(opinfo, samples_per_op)
    samples = [
        s
        for s in samples
        if all(
            t.device.type == "cpu" and t.layout == torch.strided and not t.is_complex()
            for t in pytree.tree_leaves((s.input, s.args, s.kwargs))
            if isinstance(t, torch.Tensor)
        )
    ]
    if not samples:
        return "skip", "no float32 CPU samples", False
    structs, leaves = _flatten(samples)
    fn_op = opinfo.op

    def fn(*tensors):
        outs = []
        for flat, spec, idx in structs:
            vals = [tensors[i] if i is not None else v for v, i in zip(flat, idx)]
            inp, args, kwargs = pytree.tree_unflatten(vals, spec)
            outs.append(fn_op(inp, *args, **kwargs))
        return [t for t in pytree.tree_leaves(outs) if isinstance(t, torch.Tensor)]

    try:
        expected = fn(*[t.clone() for t in leaves])
        gm = make_fx(fn)(*[t.clone() for t in leaves])
    except Exception as e:  # noqa: BLE001
        return "skip", f"eager/make_fx: {type(e).__name__}", False
    try:
        compiled = compile_graph_strict(gm, leaves)
        got = compiled(*[t.clone() for t in leaves])
    except GraphUnsupported as e:
        return "eager", f"graph runs eagerly: {e}", False
    except Exception as e:  # noqa: BLE001
        return "fail", f"compile/run: {type(e).__name__}: {str(e).splitlines()[0][:200]}", False
    lowered = not any(isinstance(n, Extern) for n in compiled.schedule.graph.nodes)
    if len(got) != len(expected):
        return "fail", f"{len(got)} outputs, eager has {len(expected)}", lowered
    for g, e in zip(got, expected):
        try:
            assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, e.shape, g.dtype, e.dtype)
            torch.testing.assert_close(g, e, equal_nan=True)
        except AssertionError as err:
            return "fail", f"mismatch: {str(err).splitlines()[0][:200]}", lowered
    return "pass", "", lowered


def main(argv=None) -> int:
    from torch.testing._internal.common_methods_invocations import op_db

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all)")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--write", default="", help="write a Markdown summary to this file")
    parser.add_argument(
        "--budget-s", type=float, default=0, help="stop after this many seconds (0: no limit)"
    )
    args = parser.parse_args(argv)
    wanted = set(filter(None, args.ops.split(",")))
    ops = [o for o in op_db if not wanted or o.name in wanted or o.full_name in wanted]
    ops = [o for o in ops if torch.float32 in o.supported_dtypes("cpu")]
    results = collections.OrderedDict()
    start = time.time()
    for o in ops:
        if args.budget_s and time.time() - start > args.budget_s:
            print(f"time budget reached after {len(results)} of {len(ops)} ops")
            break
        try:
            results[o.full_name] = run_op(o, args.samples)
        except Exception as e:  # noqa: BLE001 - the sweep reports, it does not stop
            results[o.full_name] = ("fail", f"harness: {type(e).__name__}: {e}"[:200], False)
            traceback.print_exc()
        status, detail, lowered = results[o.full_name]
        print(f"{status:5} {'kernel' if lowered else 'extern'} {o.full_name} {detail}", flush=True)
    counts = collections.Counter(s for s, _, _ in results.values())
    ran = counts["pass"] + counts["fail"]
    lowered = sum(1 for s, _, low in results.values() if s == "pass" and low)
    rate = 100.0 * counts["pass"] / max(ran, 1)
    summary = (
        f"{counts['pass']}/{ran} ops pass ({rate:.1f}%), {counts['skip']} skipped, "
        f"{counts['eager']} non-functional graphs run eagerly by design; "
        f"{lowered} passing ops fully lowered to C++ kernels; {len(results)} of {len(ops)} "
        f"float32 OpInfo entries swept in {time.time() - start:.0f}s"
    )
    print(summary)
    if args.write:
        _write(args.write, summary, results, argv)
    return 0 if counts["fail"] == 0 else 1


def _write(path, summary, results, argv):
    fails = [(k, d) for k, (s, d, _) in results.items() if s == "fail"]
    cmd = "python benchmarks/opinfo_sweep.py " + " ".join(argv or sys.argv[1:])
    lines = [
        "# kiln C++ codegen: OpInfo sweep (float32, CPU, forward)",
        "",
        "- date: 2026-11-21",
        "- machine: 2-core CPU; Python 3.11; torch 2.13.0+cpu; g++ 12",
        f"- command: `{cmd.strip()}`",
        "",
        f"**Result:** {summary}",
        "",
        "An op passes when the compiled graph (up to 4 sample inputs of the op in one graph)",
        "matches eager within `torch.testing.assert_close` defaults, whether it was lowered to",
        "a kernel or kept as an extern ATen call. Skipped: no float32 CPU samples, or eager /",
        "`make_fx` could not run the samples.",
        "",
        "## Failures",
        "",
    ]
    lines += [f"- `{k}`: {d}" for k, d in fails] or ["(none)"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
