"""The `kiln` command: `kiln demo`, `kiln bench ...`, `kiln explain script.py`, `kiln doctor`.

Each subcommand lives with its stage; this file only parses the first word and dispatches.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "demo": ("kiln.bench.cli", "demo_main", "compile a small model, check it, print the speedup"),
    "bench": ("kiln.bench.cli", "bench_main", "run the benchmark suite (kiln bench --help)"),
    "explain": (
        "kiln.capture.explain",
        "explain_main",
        "run a script; explain its graphs, breaks, guards (kiln explain script.py)",
    ),
    "native": (
        "kiln.native",
        "main",
        "build kiln's native guard checks now (else lazily, at nice 19); --status says which",
    ),
    "report": ("kiln.report", "main", "render a compile trace as one HTML page (kiln report DIR)"),
    "cache": ("kiln.runtime.cache_cli", "main", "kiln cache info | kiln cache clear [--native]"),
    "doctor": ("kiln.doctor", "main", "say what this installation does: compiler, caches, native"),
}


def _usage() -> str:
    lines = ["usage: kiln <command> [args]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, _, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"kiln: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, attr, _ = SUBCOMMANDS[name]
    return int(getattr(importlib.import_module(module), attr)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
