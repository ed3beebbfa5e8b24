"""Cold first-call time of small graphs, kiln against torch.compile, split by stage.

Each compiler runs each graph in a fresh Python process with fresh, empty cache folders
(`KILN_CACHE_DIR`, `KILN_NATIVE_DIR`, `TORCHINDUCTOR_CACHE_DIR`, `TRITON_CACHE_DIR`), as a new
user's first run does. The child imports torch, builds the inputs, runs the graph eagerly once
(timed: "eager first call"), then compiles it and times the first compiled call. For kiln the
first call is split into exclusive stages (each stage's time excludes the stages and imports
it contains): module imports (every module the main thread loads during the call, timed by
wrapping the import system's loader; the slowest named), AOT autograd (analysis, tracing,
partition, the decomposition table), the pipeline's passes (rewrites, lower, schedule,
render, wrap), the build (the C++ compiler run, loading the library, the rest: the Triton
builder on CUDA), the first run's wait for kernels still compiling, and the rest ("capture
and other": bytecode capture, guards, the residual program, the wrappers' first run). The
patches are applied as each module loads, so no import moves out of the timed call. For
torch.compile the imports are split out likewise and the rest is one figure. A kiln graph
that fell back to eager kernels is reported (it would time no compile).

With `--async`, kiln runs with `options={"compile.async": True}`: the first call runs eagerly
while the graph compiles in the background; the child then calls again until compiled code
runs, and reports "time until compiled" (from the start of the first call).

Usage: PYTHONPATH=src python3 benchmarks/cold_compile.py [--device cpu|cuda]
       [--graphs pointwise,softmax_ln] [--compilers kiln,torch] [--repeat N] [--async]
       [--json FILE]
Prints one line per run and a median table; `--json` writes every run's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

# (shape on the CPU, shape on CUDA): the GPU rows, scaled down for a 2-core CPU
SIZES = {
    "pointwise": ((1 << 22,), (1 << 26,)),
    "softmax_ln": ((2048, 1024), (32768, 2048)),
}


def pointwise(x):
    """The pointwise 6-op chain."""
    return ((x.sin() * 2 + 1).relu().exp() - x).tanh()


def softmax_ln(x):
    import torch

    y = torch.softmax(x, dim=-1)
    return torch.nn.functional.layer_norm(y, y.shape[-1:])


GRAPHS = {"pointwise": pointwise, "softmax_ln": softmax_ln}

# kiln functions timed as stages: (module, attribute path, stage). Patched when the module
# loads, so the imports they bring stay inside the timed first call.
KILN_STAGES = [
    ("kiln.autograd.compile", "analyze", "aot: analyze"),
    ("kiln.autograd.compile", "trace_inference", "aot: trace"),
    ("kiln.autograd.compile", "trace_training", "aot: trace"),
    ("kiln.autograd.compile", "partition_joint", "aot: partition"),
    ("kiln.autograd.decomps", "default_decompositions", "aot: decomposition table"),
    ("kiln.codegen.pipeline", "run_rewrites", "rewrites"),
    ("kiln.codegen.pipeline", "lower_graph", "lower"),
    ("kiln.codegen.pipeline", "schedule", "schedule"),
    ("kiln.codegen.cpp.device", "CppCodeGen.render", "render"),
    ("kiln.codegen.cpp.device", "CppCodeGen.wrap", "wrap"),
    ("kiln.codegen.cpp.device", "CppCodeGen.build", "build: other"),
    ("kiln.runtime.cpp_builder", "_compile", "build: C++ compiler"),
    ("kiln.runtime.cpp_builder", "LoadedLibrary.__init__", "build: load library"),
    ("kiln.codegen.triton.device", "TritonCodeGen.start", "build: Triton workers start"),
    ("kiln.codegen.triton.device", "TritonCodeGen.render", "render"),
    ("kiln.codegen.triton.device", "TritonCodeGen.wrap", "wrap"),
    ("kiln.codegen.triton.device", "TritonCodeGen.build", "build: other"),
    ("kiln.codegen.compiled", "CompiledGraph._first", "wait for kernels compiling"),
]


class Stages:
    """Exclusive stage timers: a stage's time excludes the stages running inside it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.imports: dict[str, float] = {}  # top-level imports' inclusive seconds
        self.stack: list[list] = []  # [stage, start, nested seconds]

    def run(self, stage: str, fn, *args, **kwargs):
        self.stack.append([stage, time.perf_counter(), 0.0])
        try:
            return fn(*args, **kwargs)
        finally:
            name, start, nested = self.stack.pop()
            total = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + total - nested
            if self.stack:
                self.stack[-1][2] += total

    def wrap(self, fn, stage: str):
        def timed(*args, **kwargs):
            return self.run(stage, fn, *args, **kwargs)

        timed.__wrapped__ = fn
        return timed


def _install(stages: Stages, patches: list) -> None:
    """Time every module load as the stage "imports", and apply `patches` to each module as it
    finishes loading (importlib's `_load_unlocked` runs every fresh module's code)."""
    import importlib._bootstrap as bootstrap

    load = bootstrap._load_unlocked
    by_module: dict[str, list] = {}
    for module, attr, stage in patches:
        by_module.setdefault(module, []).append((attr, stage))

    def patch(module, attr: str, stage: str) -> None:
        owner = module
        *outer, name = attr.split(".")
        for part in outer:
            owner = getattr(owner, part)
        fn = getattr(owner, name)
        if attr == "CompiledGraph._first":  # the wait is the pending build's `finish`

            def first(self, pending, _fn=fn):
                finish = stages.wrap(pending.finish, stage)
                return _fn(self, module.FirstCall(finish, pending.call))

            setattr(owner, name, first)
        else:
            setattr(owner, name, stages.wrap(fn, stage))

    def timed_load(spec):
        if not stages.stack or threading.current_thread() is not threading.main_thread():
            # outside the timed call, or not the main thread's (whose stack this is; kiln's
            # background compile and torch.compile's threads import too)
            module = load(spec)
        else:
            top = not any(s[0] == "imports" for s in stages.stack)
            start = time.perf_counter()
            module = stages.run("imports", load, spec)
            if top:
                stages.imports[spec.name] = time.perf_counter() - start
        for attr, stage in by_module.pop(spec.name, ()):
            patch(module, attr, stage)
        return module

    bootstrap._load_unlocked = timed_load
    for name in list(by_module):  # modules already loaded
        if name in sys.modules:
            for attr, stage in by_module.pop(name):
                patch(sys.modules[name], attr, stage)


def child(args) -> None:
    t0 = time.perf_counter()
    import torch

    t_torch = time.perf_counter() - t0
    device = args.device
    shape = SIZES[args.graph][1 if device == "cuda" else 0]
    fn = GRAPHS[args.graph]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.zeros(1, device="cuda")  # CUDA start-up is no compiler's
    stages = Stages()
    _install(stages, KILN_STAGES if args.compiler == "kiln" else [])
    out: dict = {"graph": args.graph, "compiler": args.compiler, "device": device}
    out["shape"] = list(shape)
    out["import torch"] = t_torch

    x = torch.randn(shape, device=device)
    start = time.perf_counter()
    expected = fn(x)
    sync()
    out["eager first call"] = time.perf_counter() - start

    start = time.perf_counter()
    if args.compiler == "kiln":
        import kiln

        out["import kiln"] = time.perf_counter() - start
        opts = {"compile.async": True} if args.async_ else None
        compiled = kiln.compile(fn, options=opts)
    else:
        compiled = torch.compile(fn)
    start = time.perf_counter()
    got = stages.run("capture and other", compiled, x)
    sync()
    first = time.perf_counter() - start
    out["first call"] = first
    ranked = sorted(stages.seconds.items(), key=lambda kv: -kv[1])
    out["stages"] = {k: round(v, 4) for k, v in ranked}
    out["slowest imports"] = dict(sorted(stages.imports.items(), key=lambda kv: -kv[1])[:6])
    torch.testing.assert_close(got, expected)
    if args.async_:
        from kiln.runtime import async_compile

        while not async_compile.STATS["swapped"]:
            compiled(x)
            sync()
            if time.perf_counter() - start > 600:
                raise RuntimeError("the background compile did not finish in 10 minutes")
        out["time until compiled"] = time.perf_counter() - start
        out["async stats"] = dict(async_compile.STATS)
    if args.compiler == "kiln":
        from kiln.backends import builtin
        from kiln.runtime import async_compile

        async_compile.wait()  # (with --async: done already)
        # a graph left to eager kernels would time no compile at all: say so, loudly
        out["fallbacks"] = [str(f) for f in builtin.fallbacks()]
    runs = []
    for _ in range(5):
        s = time.perf_counter()
        got = compiled(x)
        sync()
        runs.append(time.perf_counter() - s)
    torch.testing.assert_close(got, expected)
    out["steady call"] = statistics.median(runs)
    print("RESULT " + json.dumps(out))


def run_child(graph: str, compiler: str, device: str, async_: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="kiln-cold-") as tmp:
        env = dict(os.environ)
        for var in ("KILN_CACHE_DIR", "KILN_NATIVE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
            env[var] = os.path.join(tmp, var.lower())
        env["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton_cache_dir")
        env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", graph]
        cmd += ["--compilers", compiler, "--device", device] + (["--async"] if async_ else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    ap.add_argument("--compilers", default="kiln,torch")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--async", dest="async_", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.graph, args.compiler = args.child, args.compilers
        return child(args)
    runs = []
    for _ in range(args.repeat):  # interleaved: load changes hit every compiler alike
        for graph in args.graphs.split(","):
            for compiler in args.compilers.split(","):
                r = run_child(graph, compiler, args.device, args.async_ and compiler == "kiln")
                runs.append(r)
                if r.get("fallbacks"):
                    print(f"WARNING: {graph} {compiler} fell back: {r['fallbacks']}")
                until = r.get("time until compiled")
                print(
                    f"{graph:11s} {compiler:5s} first call {r['first call']:.3f} s"
                    + (f", compiled code after {until:.3f} s" if until else "")
                    + f" (eager first call {r['eager first call']:.3f} s); stages "
                    + ", ".join(f"{k} {v:.3f}" for k, v in r["stages"].items() if v >= 0.005),
                    flush=True,
                )
    print(f"\nmedians of {args.repeat} run(s), load average {os.getloadavg()[0]:.2f}:")
    for graph in args.graphs.split(","):
        firsts = {}
        for compiler in args.compilers.split(","):
            rs = [r for r in runs if r["graph"] == graph and r["compiler"] == compiler]
            firsts[compiler] = statistics.median(r["first call"] for r in rs)
            line = f"  {graph:11s} {compiler:5s} first call {firsts[compiler]:.3f} s"
            if rs[0].get("time until compiled"):
                until = statistics.median(r["time until compiled"] for r in rs)
                line += f", compiled after {until:.3f} s"
            print(line)
        if "kiln" in firsts and "torch" in firsts:
            print(f"  {graph:11s} kiln / torch.compile: {firsts['kiln'] / firsts['torch']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "repeat": args.repeat, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
