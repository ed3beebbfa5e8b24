"""`kiln.explain(fn)(*args)` and the `kiln explain script.py` command.

Takes a function (or a whole script) and runs it through kiln's capture; gives, per compiled
callable, the graphs with their op counts, every graph break with its reason, source line and
hint, the guards of every cache entry (continuations included), and the number of compiles.
"""

from __future__ import annotations

import collections
import runpy
import sys
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ExplainOutput:
    label: str
    graphs: list[torch.fx.GraphModule] = field(default_factory=list)
    breaks: list[tuple[str, str, str]] = field(default_factory=list)  # reason, where, hint
    guards: list[tuple[str, list[str]]] = field(default_factory=list)  # entry label, guards
    compiles: int = 0
    eager_reasons: list[str] = field(default_factory=list)
    graph_labels: list[str] = field(default_factory=list)  # the unit each graph came from
    splits: list[str] = field(default_factory=list)  # eager bookkeeping around compiled modules

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def graph_break_count(self) -> int:
        return len(self.breaks)

    def op_counts(self) -> list[collections.Counter]:
        out = []
        for gm in self.graphs:
            ops = collections.Counter()
            for n in gm.graph.nodes:
                if n.op in ("call_function", "call_method", "call_module"):
                    ops[_target_name(n)] += 1
            out.append(ops)
        return out

    def __str__(self) -> str:
        lines = [
            f"kiln explain: {self.label}",
            f"  graphs: {self.graph_count}   graph breaks: {self.graph_break_count}   "
            f"compiled entries: {self.compiles}",
        ]
        labels = self.graph_labels or [""] * len(self.graphs)
        for i, (label, ops) in enumerate(zip(labels, self.op_counts())):
            top = ", ".join(f"{k} x{v}" for k, v in ops.most_common(6))
            lines.append(f"  graph {i} ({label}): {sum(ops.values())} ops: {top}")
        for i, (reason, where, hint) in enumerate(self.breaks):
            lines.append(f"  break {i}: {reason}\n    at {where}")
            if hint:
                lines.append(f"    hint: {hint}")
        for note in self.splits:
            lines.append(f"  split: {note}")
        for reason in self.eager_reasons:
            lines.append(f"  runs eagerly: {reason.splitlines()[0]}")
        for label, gs in self.guards:
            lines.append(f"  guards of {label}:")
            lines += [f"    {g}" for g in gs]
        return "\n".join(lines)

    __repr__ = __str__


def report(cf) -> ExplainOutput:
    """Everything one compiled callable (and its continuations) did so far."""
    out = ExplainOutput(cf.label, breaks=list(dict.fromkeys(cf.breaks)))
    out.splits = list(dict.fromkeys(cf.splits))
    units = [cf, *cf.continuations.values()]
    for nested in cf.nested:  # modules compiled apart (a DDP module's), with their graphs
        units += [nested, *nested.continuations.values()]
        out.breaks += [b for b in dict.fromkeys(nested.breaks) if b not in out.breaks]
        out.splits += [s for s in dict.fromkeys(nested.splits) if s not in out.splits]
    for unit in units:
        out.graphs += unit.graph_modules
        out.graph_labels += [unit.label] * len(unit.graph_modules)
        out.compiles += len(unit.entries)
        if unit.eager_reason:
            out.eager_reasons.append(f"{unit.label}: {unit.eager_reason}")
        for k, (guards, _namer) in enumerate(unit.entry_guards):
            out.guards.append((f"{unit.label} entry {k}", [g.describe() for g in guards]))
    return out


def explain_main(argv: list[str]) -> int:
    """`kiln explain script.py [args...]`: run the script; report every compiled function."""
    from . import frontend

    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: kiln explain script.py [args...]\n\nRuns the script and prints, for every "
            "function it compiled with kiln, the graphs, graph breaks (reason, source line, "
            "hint), guards and compiles."
        )
        return 0 if argv else 2
    script = argv[0]
    frontend._explaining.clear()
    frontend._explaining.append(None)  # non-empty: collect
    old_argv = sys.argv
    sys.argv = list(argv)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            print(f"kiln explain: the script exited with {e.code}", file=sys.stderr)
    finally:
        sys.argv = old_argv
        collected = [c for c in frontend._explaining if c is not None]
        frontend._explaining.clear()
    roots = [c for c in collected if not hasattr(c, "root_cf")]
    if not roots:
        print("kiln explain: the script compiled nothing with kiln.compile")
        return 0
    for cf in roots:
        print(report(cf))
        print()
    return 0


def _target_name(node) -> str:
    t = node.target
    if isinstance(t, str):
        return t
    mod = getattr(t, "__module__", "") or ""
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", repr(t))
    return f"{mod.replace('torch._C._nn', 'F').replace('_operator', 'operator')}.{name}"


_ = Any
