"""The fresh-process driver the dynamic-shape benchmarks share (dynamic_serving.py,
dynamic_decode.py), and how they count compiles.

Each compiler of such a benchmark runs in a process of its own, so that one's compiled code,
caches and counters cannot flatter or burden another's: the driver runs the benchmark's own
script again with `--only NAME` and the worker's arguments, reads the one `RESULT {json}` line
the worker prints (`emit`), and keeps its error output instead when it fails. `write_json`
saves the results under the benchmark's name. Every worker starts with empty compile caches
(kiln's, TorchInductor's and Triton's in a fresh temporary folder), so "first call" and "wall
time with compiles" are cold for every compiler, whatever ran on the machine before.

Compiles: torch.compile's are its unique graphs (`torch._dynamo.utils.counters`, read only);
kiln's are its captured graphs (`capture_compiles`) and the graphs its code generator built
(`codegen_counter`, counted around `kiln.codegen.compile_graph`: graphs built again for new
sizes included).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Callable

RESULT = "RESULT "


def emit(result: dict) -> None:
    """The worker's answer: one line the driver finds among whatever else it printed."""
    print(RESULT + json.dumps(result), flush=True)


def run_worker(script: str, argv: list[str], failed: dict) -> dict:
    """Run `script` with `argv` in a fresh Python process; its RESULT, or `failed` with the
    tail of its error output."""
    from kiln.bench.worker import fresh_cache_env

    with tempfile.TemporaryDirectory(prefix="kiln-bench-cache-") as cache:
        cmd = [sys.executable, script, *argv]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=fresh_cache_env(cache))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode or not lines:
        return {**failed, "error": proc.stderr[-3000:]}
    return json.loads(lines[-1][len(RESULT) :])


def write_json(path: str | None, benchmark: str, results: list[dict]) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"benchmark": benchmark, "results": results}, f, indent=1)


def codegen_counter() -> dict[str, int]:
    """Count kiln's code-generator builds: wrap `kiln.codegen.compile_graph`, which the
    inductor backend imports at compile time. Call before compiling; read `["n"]` after."""
    import kiln.codegen as codegen

    count = {"n": 0}
    real = codegen.compile_graph

    def counted(*a, **k):
        count["n"] += 1
        return real(*a, **k)

    codegen.compile_graph = counted
    return count


def capture_compiles(compiled) -> int:
    """Graphs kiln captured for a compiled callable, its graph breaks' continuations included."""
    cf = compiled._kiln_compiled
    return cf.compiles + sum(c.compiles for c in cf.continuations.values())


def compiled_for(name: str, model) -> tuple[Callable, Callable[[], dict[str, Any]]]:
    """`model` as compiler `name` runs it (eager, torch.compile with dynamic=None, or kiln),
    and a function giving its compile counts once the work is done."""
    if name == "eager":
        return model, dict
    if name == "torch":
        import torch

        def torch_counts() -> dict[str, Any]:
            from torch._dynamo.utils import counters

            return {"compiles": int(counters["stats"]["unique_graphs"])}

        return torch.compile(model, dynamic=None), torch_counts
    import kiln

    builds = codegen_counter()
    fn = kiln.compile(model)

    def kiln_counts() -> dict[str, Any]:
        captured = capture_compiles(fn)
        return {"capture_compiles": captured, "codegen_compiles": builds["n"], "compiles": captured}

    return fn, kiln_counts
