"""rewrites/: every ATen-level rewrite made before lowering, as named passes.

In: a functional ATen `torch.fx.GraphModule` and its example inputs. Out: the same graph module,
rewritten in place (and recompiled) by the passes a device lists, in the order it lists them. A
pass is a plain function `(gm, example_inputs) -> int` (how many places it changed; 0 = none),
registered by name with `@rewrite(name)`; a device names its list (`Device.rewrites`), so what
differs between devices is a list of names, not code paths.

Passes (one file each):
  functionalize_restrides   restride.py       `as_strided_` of an intermediate -> `as_strided`
  fake_metadata             meta.py           every node's `val` (fake output), propagated once
  unfuse_bias_adds          bias_add.py       `addmm` -> `mm` + add where the add fuses anyway
  scatter_embedding_grads   embedding_grad.py tied/position embedding gradients without ATen's
                                              fill-and-add
  pad_matmuls               pad_mm.py         GPU matmuls padded to 16-byte aligned widths
  matvec_reductions         matvec.py         GPU one-row matmuls as float32 reductions
  channels_last_convolutions conv_layout.py   convolutions read channels-last inputs
  merge_repeats             cse.py            calls that repeat earlier equal calls are merged

Why it exists: the rewrites used to live in two stages and two device paths; here each is one
named pass, and `KILN_LOGS=passes` prints the graph after each one that changed it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

from .. import logs

RewriteFn = Callable[[torch.fx.GraphModule, list], int]
F = TypeVar("F", bound=RewriteFn)  # a rewrite keeps its own signature once registered


@dataclass(frozen=True)
class Rewrite:
    name: str
    fn: RewriteFn
    doc: str


REWRITES: dict[str, Rewrite] = {}


def rewrite(name: str) -> Callable[[F], F]:
    """Register `fn` as the ATen rewrite `name` (names are unique)."""

    def register(fn: F) -> F:
        if name in REWRITES:
            raise ValueError(f"an ATen rewrite named {name!r} is registered already")
        REWRITES[name] = Rewrite(name, fn, (fn.__doc__ or "").strip().splitlines()[0])
        return fn

    return register


def check_names(names: Iterable[str]) -> tuple[str, ...]:
    """`names` as a tuple, each one a registered rewrite (a clear error otherwise)."""
    names = tuple(names)
    unknown = [n for n in names if n not in REWRITES]
    if unknown:
        raise ValueError(
            f"unknown ATen rewrite(s) {', '.join(map(repr, unknown))}; registered: "
            f"{', '.join(sorted(REWRITES))}"
        )
    return names


def run_rewrites(
    gm: torch.fx.GraphModule, example_inputs: list, names: Iterable[str]
) -> dict[str, int]:
    """Run the rewrites `names` on `gm` in order; gives how many places each one changed."""
    changed: dict[str, int] = {}
    for name in check_names(names):
        count = REWRITES[name].fn(gm, example_inputs)
        changed[name] = count
        if count:
            logs.log("passes", _after(name, count, gm))
    return changed


def _after(name: str, count: int, gm: torch.fx.GraphModule) -> Callable[[], str]:
    return lambda: f"after rewrite {name} ({count} changed):\n{gm.graph}"


# the passes register themselves on import
from . import (  # noqa: E402,F401
    bias_add,
    conv_layout,
    cse,
    embedding_grad,
    matvec,
    meta,
    pad_mm,
    restride,
)

__all__ = ["REWRITES", "Rewrite", "check_names", "rewrite", "run_rewrites"]
