"""Guard tables: the held facts that share one check, checked by one call per table.

Takes the first guard of a table (guards.GuardSet.check_lines groups guards of held objects by
their check) and the table's rows; gives the entry function's lines that check them. Four kinds
of table have a native check (kiln/native): held tensors (type, dtype, device, sizes,
strides, requires_grad), attribute constants read from a held `__dict__`, held objects keeping
their `__dict__`, and modules with empty hook dictionaries. Those become one call,
`___tabN.check()`, which runs the table's Python loop until the native module has loaded and its
C++ loop after. Any other table is the Python loop written into the entry, as before.

Why: these tables are most of a large model's guard time (ResNet-50: 267 tensors, ~460
constants, ~150 modules, ~350 us a call in Python on the H200 host; torch.compile checks the
same facts in C++).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .sources import ConstSource, InstanceDictSource

if TYPE_CHECKING:
    from .guards import Guard
    from .sources import Namer

_CPU = torch.device("cpu")


def table_lines(first: Guard, rows: list[tuple], namer: Namer) -> list[str]:
    names, check = first.table()
    rows_t = tuple(rows)
    if not _has_native(first):
        return [
            f"for {names} in {namer.const(rows_t, 'rows')}:",
            f"    if not ({check}):",
            "        return ___MISS",
        ]
    from .. import native  # here: importing it starts nothing, but most guards need none

    kind, extra = first.native
    if kind == "tensors":  # (s, type, dtype, sizes, strides, requires_grad[, device])
        native_rows = tuple(
            (r[0], r[1], r[2], r[6] if len(r) > 6 else _CPU, *r[3:6]) for r in rows_t
        )
    else:
        native_rows = rows_t
    table = native.table(kind, native_rows, extra, _python_loop(names, check, rows_t))
    what = f"{len(rows_t)} rows of: {check}"  # what the table checks, for a reader of the entry
    return [f"if not {namer.const(table, 'tab')}.check():  # {what}", "    return ___MISS"]


def _has_native(first: Guard) -> bool:
    """Whether a native kind fits this table's rows: attribute constants located by a held
    `__dict__` and key, the others by the held object itself."""
    if first.native is None or first.other is not None:
        return False
    wanted = InstanceDictSource if first.native[0] == "items" else ConstSource
    return type(first.source) is wanted


def _python_loop(names: str, check: str, rows: tuple):
    src = (
        "def ___table(___rows=___rows):\n"
        f"    for {names} in ___rows:\n"
        f"        if not ({check}):\n"
        "            return False\n"
        "    return True\n"
    )
    scope = {"___rows": rows}
    exec(compile(src, "<kiln guard table>", "exec"), scope)
    return scope["___table"]
