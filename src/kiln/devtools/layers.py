"""The import-layer contracts between kiln's stages, checked: `python -m kiln.devtools.layers`.

Takes kiln's source tree; gives the import graph between its parts (every `import` statement,
function-level ones included, since a deferred import is still a dependency) and the list of
imports that break a contract. Exit status 1 when there is one. tests/devtools runs it in CI.

The contracts (docs/architecture.md draws the same map):

* each part may import only the parts `ALLOWED` lists for it — the stages are layered, and a
  stage never imports one above it (capture does not import backends or runtime; lower and
  schedule import nothing from codegen);
* no module imports a name from the package root `kiln/__init__.py` (the root imports the
  stages, so the stages importing it back is a cycle; the version lives in `version.py`).

Why it exists: a map that nothing checks goes stale (STYLE.md item 13).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # src/kiln

BASE = frozenset(
    {
        "version",
        "logs",
        "options",
        "gc_pause",
        "lazy_graphs",
        "lazy_exports",
        "pycode",
        "native",
        "contracts",
        "trace",
        "symbolic_dispatch",
    }
)

# part -> the parts it may import (besides itself and the base modules). A part is a top-level
# module or subpackage of kiln.
ALLOWED: dict[str, frozenset[str]] = {
    "rewrites": frozenset(),
    "devices": frozenset({"rewrites"}),
    "lower": frozenset({"devices", "rewrites"}),
    "schedule": frozenset({"lower", "devices"}),
    "runtime": frozenset({"devices"}),
    "autograd": frozenset(),
    "capture": frozenset(),
    "codegen": frozenset({"lower", "schedule", "rewrites", "devices", "runtime"}),
    "backends": frozenset({"autograd", "codegen", "devices", "runtime"}),
    "api": frozenset({"capture", "backends", "devices", "runtime"}),
    # tools on top of everything
    "bench": None,  # type: ignore[dict-item]
    "cli": None,  # type: ignore[dict-item]
    "devtools": None,  # type: ignore[dict-item]
    "testing": None,  # type: ignore[dict-item]
    "doctor": None,  # type: ignore[dict-item]
    "report": None,  # type: ignore[dict-item]
    "__main__": None,  # type: ignore[dict-item]
}


# Cycles known and not yet broken, each with its reason; the test fails on any other cycle, and
# on an entry here that no longer occurs (so the list only shrinks).
KNOWN_CYCLES: dict[frozenset[str], str] = {
    frozenset(
        {
            "capture.attributes",
            "capture.builtin_specials",
            "capture.calls",
            "capture.context_vars",
            "capture.environ",
            "capture.module_calls",
        }
    ): "capture's call dispatch is mutually recursive (calling a module or a builtin calls "
    "functions again); the handlers import calls.interp_call at call time. To break it, "
    "reach interp_call through the Interpreter object instead of an import.",
}


@dataclass(frozen=True)
class Import:
    module: str  # importing module, dotted, relative to kiln ("capture.frontend")
    target: str  # imported module, dotted, relative to kiln ("backends.registry"); "" = root
    names: tuple[str, ...]  # names imported from it (`from X import a, b`)
    line: int

    @property
    def source(self) -> str:
        return self.module.split(".")[0]

    @property
    def dest(self) -> str:
        return self.target.split(".")[0]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str | None:
    """The kiln-relative name of a (possibly relative) import, None if outside kiln."""
    if level == 0:
        if target is None or not (target == "kiln" or target.startswith("kiln.")):
            return None
        return target[len("kiln.") :] if target != "kiln" else ""
    base = module.split(".") if module else []
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    if target:
        base = base + target.split(".")
    return ".".join(base)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (annotations only: nothing runs)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def imports() -> list[Import]:
    """Every import between kiln's modules (those made only for type checkers excepted)."""
    found: list[Import] = []
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _resolve(module, is_package, 0, alias.name)
                    if target is not None:
                        found.append(Import(module, target, (), node.lineno))
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(module, is_package, node.level, node.module)
                if target is None:
                    continue
                names = tuple(a.name for a in node.names)
                if target == "":  # `from .. import logs`: a name may be a module of its own
                    mods = [n for n in names if (ROOT / n).is_dir() or (ROOT / f"{n}.py").exists()]
                    for name in mods:
                        found.append(Import(module, name, (), node.lineno))
                    rest = tuple(n for n in names if n not in mods)
                    if rest:
                        found.append(Import(module, "", rest, node.lineno))
                else:
                    found.append(Import(module, target, names, node.lineno))
    return found


def violations(found: list[Import] | None = None) -> list[str]:
    """Each import that breaks a contract, as `module:line: why`."""
    out = []
    for imp in found if found is not None else imports():
        where = f"kiln/{imp.module.replace('.', '/') or '__init__'}:{imp.line}"
        tool = ALLOWED.get(imp.source, ()) is None
        if imp.target == "" and imp.module != "" and not tool:
            names = ", ".join(imp.names) or "kiln"
            out.append(f"{where}: imports {names} from the package root")
            continue
        src, dst = imp.source, imp.dest
        if imp.target == "":
            continue  # a tool's `import kiln`: the public API
        if src == dst or src == "" or dst in BASE or src not in ALLOWED:
            if src not in ALLOWED and src not in BASE and src != "":
                out.append(f"{where}: part {src!r} is not in the layer map (devtools/layers.py)")
            elif src in BASE and dst not in BASE and dst != src:
                out.append(f"{where}: base module {src} imports {imp.target}")
            continue
        allowed = ALLOWED[src]
        if allowed is None:  # a tool on top: may import anything
            continue
        if dst not in allowed:
            out.append(f"{where}: {src} imports {imp.target} (allowed: {_names(allowed)})")
    return sorted(set(out))


def cycles(found: list[Import] | None = None) -> list[list[str]]:
    """Groups of modules that import one another, directly or through others (function-level
    imports included: a deferred import hides a cycle, it does not remove it)."""
    modules = {_module_name(p) for p in ROOT.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for imp in found if found is not None else imports():
        target = imp.target
        for name in imp.names:  # `from .pkg import submodule`
            if f"{target}.{name}".lstrip(".") in modules:
                edges.setdefault(imp.module, set()).add(f"{target}.{name}".lstrip("."))
        if target in modules and target != imp.module and not imp.module.startswith(target):
            edges.setdefault(imp.module, set()).add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def _names(parts) -> str:
    return ", ".join(sorted(parts | BASE)) if parts is not None else "anything"


def graph(found: list[Import] | None = None) -> dict[str, set[str]]:
    """part -> parts it imports."""
    edges: dict[str, set[str]] = {}
    for imp in found if found is not None else imports():
        if imp.source != imp.dest and imp.dest:
            edges.setdefault(imp.source or "kiln", set()).add(imp.dest)
    return edges


def main() -> int:
    found = imports()
    print("import graph between kiln's parts (part -> what it imports):")
    for part, deps in sorted(graph(found).items()):
        print(f"  {part:10} -> {', '.join(sorted(deps))}")
    bad = violations(found)
    found_cycles = cycles(found)
    for group in found_cycles:
        if frozenset(group) in KNOWN_CYCLES:
            print(f"known import cycle: {' <-> '.join(group)}: {KNOWN_CYCLES[frozenset(group)]}")
        else:
            bad.append(f"import cycle: {' <-> '.join(group)}")
    for gone in set(KNOWN_CYCLES) - {frozenset(g) for g in found_cycles}:
        bad.append(f"a known cycle is gone; remove it from KNOWN_CYCLES: {sorted(gone)}")
    if bad:
        print(f"\n{len(bad)} import(s) break the layer contracts:")
        for line in bad:
            print(f"  {line}")
        return 1
    print("\nno import breaks the layer contracts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
