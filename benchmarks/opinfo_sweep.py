"""OpInfo sweep of a compiler on CPU: every op in PyTorch's `op_db`, float32, forward.

Takes op names (default: all of `op_db`) and a compiler: `kiln` (default) or `torch`. For each
op, up to `--samples` of its sample inputs are traced into ONE function; `kiln` traces it to an
ATen graph (`make_fx`) and compiles that with `kiln.codegen.compile_graph_strict`; `torch`
compiles the same Python function with `torch.compile` (default backend, `torch._dynamo.reset()`
before each op so no op runs into another's cache limit). Every output is compared with eager
on the same inputs. An op passes if the compiled function matches eager — whether kiln lowered
it to a kernel or kept it as an `Extern` call. Ops whose samples eager or `make_fx` cannot run
are "skipped" for both compilers, so both sweep the same op set.

Ops that cannot match eager value for value are compared differently, the same way for both
compilers, and counted apart in the summary (never silently):

* `uninitialized` (OpInfo's `has_nondeterministic_output`: `empty*`): shape, dtype, device and
  strides only;
* `random` (`RANDOM_OPS`: `rand*`, `normal`, `bernoulli`, dropout, ...): shape, dtype, device,
  and the values' distribution: a two-sample Kolmogorov-Smirnov test against eager's values
  over several draws (OpInfo seeds each call; each draw shifts that seed).

Usage:
    python benchmarks/opinfo_sweep.py                      # full sweep of kiln
    python benchmarks/opinfo_sweep.py --compiler torch --samples 2 --json torch.json
    python benchmarks/opinfo_sweep.py --combine kiln.json torch.json --write out.md
    python benchmarks/opinfo_sweep.py --dynamic --samples 2 --json kiln_dynamic.json

`--dynamic` runs each op's function through `kiln.compile(fn, dynamic=True)` (capture, AOT
autograd and code generation with every dimension symbolic) and compares it with eager like the
others; it also compiles the function with `dynamic=False` and counts the ops whose static
graphs are all kernels but whose dynamic graphs keep ATen calls, are declined or run eagerly
(each named in the op's detail after "fallback:").

`tests/codegen/test_opinfo_subset.py` runs `run_op` on a small subset in CI.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import sys
import time
import traceback

import torch
import torch.utils._pytree as pytree

# Ops whose outputs come from the random number generator (OpInfo has no flag for these).
RANDOM_OPS = frozenset(
    "rand_like randn randn_like randint randint_like normal normal.number_mean normal.in_place "
    "bernoulli multinomial uniform cauchy exponential geometric log_normal nn.functional.rrelu "
    "nn.functional.dropout nn.functional.dropout2d nn.functional.dropout3d "
    "nn.functional.alpha_dropout nn.functional.feature_alpha_dropout.with_train "
    "nn.functional.fractional_max_pool2d nn.functional.fractional_max_pool3d".split()
)
RANDOM_DRAWS = 8  # eager runs that give a random op's range and statistics


def comparison_kind(opinfo) -> str:
    """'values', 'uninitialized' or 'random': how this op's outputs are compared with eager."""
    if getattr(opinfo, "has_nondeterministic_output", False):
        return "uninitialized"
    return "random" if opinfo.full_name in RANDOM_OPS else "values"


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


def _compile_kiln(fn, gm, leaves):
    from kiln.codegen import compile_graph_strict
    from kiln.lower.graph import is_fallback

    compiled = compile_graph_strict(gm, leaves)
    lowered = not any(is_fallback(n) for n in compiled.schedule.graph.nodes)  # checks don't count
    return compiled, lowered


def _compile_torch(fn, gm, leaves):
    torch._dynamo.reset()
    return torch.compile(fn), False


def _built_graphs(fn, leaves, dynamic: bool):
    """`kiln.compile(fn, dynamic=dynamic)`, called once on copies of `leaves`, and what the
    code generator answered for each graph it was given: a `CompiledGraph`, a `Declined` or
    the exception it raised (the backend then builds per size or runs eagerly)."""
    import kiln
    import kiln.codegen as codegen

    built: list = []
    real = codegen.compile_graph

    def watched(*a, **k):
        try:
            out = real(*a, **k)
        except Exception as e:  # the backend falls back; the sweep names the crash
            built.append(e)
            raise
        built.append(out)
        return out

    codegen.compile_graph = watched
    try:
        compiled = kiln.compile(fn, dynamic=dynamic)
        compiled(*_copies(leaves))
    finally:
        codegen.compile_graph = real
    return compiled, built


def fallbacks(compiled, built) -> list[str]:
    """Why a compiled function's graphs do not all run as generated kernels: graphs the code
    generator declined, ATen ops it kept as calls, or the function run eagerly by capture."""
    from kiln.codegen import Declined
    from kiln.lower.graph import is_fallback

    out = []
    reason = compiled._kiln_compiled.eager_reason
    if reason is not None:
        out.append(f"runs eagerly: {_first_line(Exception(reason))}")
    if not built and reason is None:
        out.append("no graph was built")
    for g in built:
        if isinstance(g, Exception):
            out.append(f"code generation raised {type(g).__name__}: {_first_line(g)}")
        elif isinstance(g, Declined):
            out.append(f"declined: {g.reason[:160]}")
        else:
            targets = {str(n.target) for n in g.schedule.graph.nodes if is_fallback(n)}
            out += [f"ATen call {t}" for t in sorted(targets)]
    return out


def _compile_kiln_dynamic(fn, gm, leaves):
    """kiln's whole pipeline under `dynamic=True` (capture, AOT autograd, codegen). `lowered`
    is whether every graph became kernels only; an op whose `dynamic=False` compile is lowered
    but whose dynamic one is not is a fallback the symbolic pipeline still has
    (`run_op(..., dynamic=True)` reports it in its detail)."""
    compiled, built = _built_graphs(fn, leaves, dynamic=True)
    why = fallbacks(compiled, built)
    compiled.kiln_fallbacks = why
    return compiled, not why


COMPILERS = {"kiln": _compile_kiln, "torch": _compile_torch}


def run_op(opinfo, samples_per_op: int = 4, compiler: str = "kiln", dynamic: bool = False):
    """('pass'|'fail'|'skip'|'eager', detail, lowered: bool) for one OpInfo entry.

    'eager': kiln found the traced graph not functional (in-place ops on views) and hands it
    back to eager by design; counted apart from passes and failures. `lowered` says kiln
    compiled the op to kernels only (always False for `torch`).

    `dynamic` (kiln only): the function goes through `kiln.compile(fn, dynamic=True)`, every
    dimension symbolic, and is compared with eager the same way; its detail names the
    fallbacks of a dynamic compile whose `dynamic=False` compile has none ("fallback: ...")."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.lower import GraphUnsupported

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

    kind = comparison_kind(opinfo)
    try:
        draws = []
        for k in range(_draws(kind)):
            with _reseeded(k):
                draws.append(fn(*_copies(leaves)))
        traced = _copies(leaves)
        gm = make_fx(fn)(*traced)
    except Exception as e:  # noqa: BLE001
        return "skip", f"eager/make_fx: {type(e).__name__}", False
    static_lowered = None
    try:
        if dynamic:
            static_lowered = not fallbacks(*_built_graphs(fn, leaves, dynamic=False))
            compiled, lowered = _compile_kiln_dynamic(fn, gm, traced)
        else:
            compiled, lowered = COMPILERS[compiler](fn, gm, traced)
        got = compiled(*_copies(leaves))
    except GraphUnsupported as e:
        return "eager", f"graph runs eagerly: {e}", False
    except Exception as e:  # noqa: BLE001
        return "fail", f"compile/run: {type(e).__name__}: {_first_line(e)}", False
    expected = draws[0]
    if len(got) != len(expected):
        return "fail", f"{len(got)} outputs, eager has {len(expected)}", lowered
    for k, (g, e) in enumerate(zip(got, expected)):
        try:
            _compare(kind, g, e, [d[k] for d in draws])
        except AssertionError as err:
            return "fail", f"mismatch ({kind}): {_first_line(err)}", lowered
    detail = "" if kind == "values" else f"compared as {kind}"
    if static_lowered and not lowered:
        detail = f"{detail} fallback: {'; '.join(compiled.kiln_fallbacks)}".strip()
    return "pass", detail, lowered


def _copies(tensors) -> list:
    """Fresh copies with the samples' strides (`clone` makes a non-dense sample, e.g. a stride-2
    index vector, contiguous: a graph traced on that must not be called with the original)."""
    out = []
    for t in tensors:
        try:
            c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            out.append(c.copy_(t))
        except RuntimeError:  # overlapping strides (an expanded sample): a dense copy
            out.append(t.clone())
    return out


def _draws(kind: str) -> int:
    return RANDOM_DRAWS if kind == "random" else 1


@contextlib.contextmanager
def _reseeded(k: int):
    """Draw `k` of a random op. OpInfo wraps random ops in `wrapper_set_seed`, which seeds 42
    before every call; shifting that seed by `k` gives draws that differ (draw 0 is eager's)."""
    seed = torch.manual_seed
    if k:
        torch.manual_seed = lambda s: seed(s + 7919 * k)
    try:
        yield
    finally:
        torch.manual_seed = seed


def _first_line(e: BaseException) -> str:
    lines = str(e).splitlines()
    return lines[0][:200] if lines else type(e).__name__


def _compare(kind: str, got: torch.Tensor, expected: torch.Tensor, draws) -> None:
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} != {tuple(expected.shape)}"
    assert got.dtype == expected.dtype, f"dtype {got.dtype} != {expected.dtype}"
    assert got.device == expected.device, f"device {got.device} != {expected.device}"
    if kind == "values":
        torch.testing.assert_close(got, expected, equal_nan=True)
    elif kind == "uninitialized":
        if got.numel() > 1:
            assert got.stride() == expected.stride(), (
                f"stride {got.stride()} != {expected.stride()}"
            )
    else:
        _compare_random(got, draws)


def _compare_random(got: torch.Tensor, draws) -> None:
    """`got` looks like one more draw of eager's distribution: finite where eager's draws are,
    and a two-sample Kolmogorov-Smirnov test against eager's values over `RANDOM_DRAWS` draws
    does not reject at alpha = 0.001 (any distribution, heavy-tailed or discrete, no
    tolerance to tune; with very few values it can reject little, and says so by passing)."""
    if got.numel() == 0:
        return
    ref = torch.cat([d.detach().reshape(-1).double() for d in draws])
    g = got.detach().reshape(-1).double()
    assert bool(torch.isfinite(g).all()) == bool(torch.isfinite(ref).all()), "non-finite values"
    ref, g = ref[torch.isfinite(ref)].sort().values, g[torch.isfinite(g)].sort().values
    if ref.numel() == 0 or g.numel() == 0:
        return
    points = torch.cat([ref, g])
    cdf_ref = torch.searchsorted(ref, points, right=True).double() / ref.numel()
    cdf_got = torch.searchsorted(g, points, right=True).double() / g.numel()
    d = float((cdf_ref - cdf_got).abs().max())
    n, m = g.numel(), ref.numel()
    critical = 1.949 * math.sqrt((n + m) / (n * m))  # c(alpha) = sqrt(-ln(alpha / 2) / 2)
    assert d <= critical, (
        f"values unlike eager's draws (Kolmogorov-Smirnov D = {d:.3f} > {critical:.3f}; "
        f"median {float(g.median()):.4g}, eager {float(ref.median()):.4g})"
    )


def sweep(
    ops, samples: int, compiler: str, budget_s: float, dynamic: bool = False
) -> tuple[dict, float]:
    results: dict = collections.OrderedDict()
    start = time.time()
    for o in ops:
        if budget_s and time.time() - start > budget_s:
            print(f"time budget reached after {len(results)} of {len(ops)} ops", flush=True)
            break
        t0 = time.time()
        try:
            status, detail, lowered = run_op(o, samples, compiler, dynamic)
        except Exception as e:  # noqa: BLE001 - the sweep reports, it does not stop
            status, detail, lowered = "fail", f"harness: {type(e).__name__}: {e}"[:200], False
            traceback.print_exc()
        results[o.full_name] = {
            "status": status,
            "detail": detail,
            "lowered": lowered,
            "kind": comparison_kind(o),
            "seconds": round(time.time() - t0, 2),
        }
        low = "kernel" if lowered else ("extern" if compiler == "kiln" else "-")
        print(f"{status:5} {low} {o.full_name} {detail}", flush=True)
    return results, time.time() - start


def summarize(
    results: dict, compiler: str, total_ops: int, seconds: float, dynamic: bool = False
) -> str:
    counts = collections.Counter(r["status"] for r in results.values())
    ran = counts["pass"] + counts["fail"]
    by_kind = collections.Counter(
        r["kind"] for r in results.values() if r["status"] == "pass" and r["kind"] != "values"
    )
    rate = 100.0 * counts["pass"] / max(ran, 1)
    out = (
        f"{compiler}: {counts['pass']}/{ran} ops pass ({rate:.1f}%) — of the passes, "
        f"{by_kind['random']} random ops by distribution (KS test) and {by_kind['uninitialized']} "
        f"uninitialized-memory ops by shape/dtype/strides; {counts['skip']} skipped; "
    )
    if compiler == "kiln":
        lowered = sum(1 for r in results.values() if r["status"] == "pass" and r["lowered"])
        out += (
            f"{counts['eager']} non-functional graphs run eagerly by design; {lowered} passing "
            "ops fully lowered to C++ kernels; "
        )
        fell = sum(1 for r in results.values() if "fallback:" in r["detail"])
        if dynamic:
            out += (
                f"{fell} ops lowered under dynamic=False fall back to ATen calls or eager "
                "under dynamic=True; "
            )
    return out + f"{len(results)} of {total_ops} float32 OpInfo entries swept in {seconds:.0f}s"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all)")
    parser.add_argument("--compiler", choices=sorted(COMPILERS), default="kiln")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--json", default="", help="write per-op results to this JSON file")
    parser.add_argument("--write", default="", help="write a Markdown summary to this file")
    parser.add_argument("--combine", nargs="+", default=[], help="JSON results to tabulate")
    parser.add_argument(
        "--budget-s", type=float, default=0, help="stop after this many seconds (0: no limit)"
    )
    parser.add_argument(
        "--dynamic",
        action="store_true",
        help="kiln only: compile with kiln.compile(fn, dynamic=True), every dimension "
        "symbolic, and count the ops lowered without it that fall back with it",
    )
    args = parser.parse_args(argv)
    if args.dynamic and args.compiler != "kiln":
        parser.error("--dynamic sweeps kiln only (torch.compile's dynamic=True is not measured)")
    if args.combine:
        write_report([_load(p) for p in args.combine], args.write)
        return 0
    from torch.testing._internal.common_methods_invocations import op_db

    wanted = set(filter(None, args.ops.split(",")))
    ops = [o for o in op_db if not wanted or o.name in wanted or o.full_name in wanted]
    ops = [o for o in ops if torch.float32 in o.supported_dtypes("cpu")]
    results, seconds = sweep(ops, args.samples, args.compiler, args.budget_s, args.dynamic)
    summary = summarize(results, args.compiler, len(ops), seconds, args.dynamic)
    name = args.compiler + (" dynamic=True" if args.dynamic else "")
    print(summary)
    run = {
        "compiler": name,
        "command": "python benchmarks/opinfo_sweep.py " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "versions": _versions(),
        "samples": args.samples,
        "ops_total": len(ops),
        "seconds": round(seconds),
        "summary": summary,
        "results": results,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(run, f, indent=1)
    if args.write:
        write_report([run], args.write)
    return 0 if all(r["status"] != "fail" for r in results.values()) else 1


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _versions() -> str:
    import platform
    import subprocess

    try:
        gxx = subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout
        gxx = gxx.splitlines()[0] if gxx else "g++ unknown"
    except OSError:
        gxx = "no g++"
    cores = len(__import__("os").sched_getaffinity(0))
    return f"{cores}-core CPU; Python {platform.python_version()}; torch {torch.__version__}; {gxx}"


_METHOD = """\
Each op's first `--samples` float32 CPU sample inputs run in one function; the compiled
function's outputs are compared with eager's on the same inputs (stride-preserving copies).
kiln compiles the `make_fx` ATen graph of that function with its C++ code generator; torch
compiles the Python function with `torch.compile` (default backend, `torch._dynamo.reset()`
before each op). A pass means the compiled function matched eager, whatever it did inside:
kiln's extern ATen calls and torch.compile's graph breaks and eager fallbacks count alike.
Values are compared with `torch.testing.assert_close` at its defaults, except for two kinds of
ops, compared the same way for both compilers and counted in their own columns:
*uninitialized* (`has_nondeterministic_output`: `empty*`): shape, dtype, device, strides;
*random* (`rand*`, `normal`, `bernoulli`, `multinomial`, dropout, fractional max pooling, ...;
list in `RANDOM_OPS`): shape, dtype, device and a two-sample Kolmogorov-Smirnov test
(alpha = 0.001) of the values against eager's over 8 draws with shifted seeds. Skipped: no
float32 CPU samples, or eager / `make_fx` could not run them.\
"""


def write_report(runs: list[dict], path: str) -> None:
    """A Markdown page: each run's summary, the pass counts on the ops every run swept, the
    ops where the compilers disagree, and each run's failures."""
    names = [r["compiler"] for r in runs]
    lines = ["# OpInfo sweep on CPU (float32, forward): " + " vs ".join(names), ""]
    lines += _METHOD.splitlines() + [""]
    for r in runs:
        lines += [
            f"## {r['compiler']}",
            "",
            f"- date: {r.get('date', '?')}; machine: {r.get('versions', '?')}",
            f"- command: `{r.get('command', '?')}`",
            f"- result: {r['summary']}",
            "",
        ]
    common = [k for k in runs[0]["results"] if all(k in r["results"] for r in runs)]
    ran = [k for k in common if all(r["results"][k]["status"] in ("pass", "fail") for r in runs)]
    lines += [
        "## Same op set",
        "",
        f"{len(common)} ops swept by every run; {len(ran)} of them ran (neither skipped nor "
        "handed back to eager by kiln) in every run. Passes on those ops:",
        "",
        "| compiler | pass (values) | pass (random, by distribution) | "
        "pass (uninitialized, by metadata) | fail |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        res = [r["results"][k] for k in ran]
        c = collections.Counter(x["kind"] for x in res if x["status"] == "pass")
        fails = sum(1 for x in res if x["status"] == "fail")
        lines.append(
            f"| {r['compiler']} | {c['values']} | {c['random']} | {c['uninitialized']} | {fails} |"
        )
    differ = [k for k in ran if len({r["results"][k]["status"] for r in runs}) > 1]
    lines += ["", "Ops where the runs disagree:", ""]
    for k in differ:
        parts = [f"{r['compiler']}: {r['results'][k]['status']}" for r in runs]
        detail = next(
            (r["results"][k]["detail"] for r in runs if r["results"][k]["status"] == "fail"), ""
        )
        lines.append(f"- `{k}` — {', '.join(parts)} ({detail})")
    if not differ:
        lines.append("(none)")
    by_kiln_eager = [k for k in common if runs[0]["results"][k]["status"] == "eager"]
    if by_kiln_eager and len(runs) > 1:
        passes = []
        for r in runs[1:]:
            n = sum(r["results"][k]["status"] == "pass" for k in by_kiln_eager)
            passes.append(f"{r['compiler']} passes {n}")
        lines += [
            "",
            f"The {len(by_kiln_eager)} graphs kiln hands back to eager (in-place ops on views; "
            "`kiln.compile` functionalizes those before codegen, this harness does not): "
            f"{', '.join(passes)}.",
        ]
    for r in runs:
        lines += ["", f"## {r['compiler']} failures", ""]
        fails = [(k, x["detail"]) for k, x in r["results"].items() if x["status"] == "fail"]
        lines += [f"- `{k}`: {d}" for k, d in fails] or ["(none)"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
