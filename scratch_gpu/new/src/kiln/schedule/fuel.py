"""Optimization fuel: a budget of optimizations, so a miscompile can be bisected to one.

Takes the `debug.fuel` option (None: unlimited); gives a `Fuel` object each scheduling decision
asks before it optimizes (`fuel.take("fuse buf3 into kernel0")`). With fuel N exactly the
first N inlinings/fusions happen, in a deterministic order; the decision where it ran out is
logged under `KILN_LOGS=schedule`, so bisecting N finds the one fusion that breaks a program
(STYLE.md item 8).

Why it exists: fusion bugs show up as wrong numbers far from their cause; fuel turns "some
fusion is wrong" into "fusion number 17 is wrong".
"""

from __future__ import annotations

from .. import logs


class Fuel:
    def __init__(self, limit: int | None = None) -> None:
        if limit is not None and limit < 0:
            raise ValueError(f"debug.fuel must be >= 0 or None, got {limit}")
        self.limit = limit
        self.used = 0
        self.refused: list[str] = []

    def take(self, what: str) -> bool:
        """True (and one unit spent) if the optimization `what` may happen."""
        if self.limit is not None and self.used >= self.limit:
            if not self.refused:
                logs.log("schedule", f"out of fuel ({self.limit}) at: {what}")
            self.refused.append(what)
            return False
        self.used += 1
        return True

    def __repr__(self) -> str:
        return f"Fuel(limit={self.limit}, used={self.used}, refused={len(self.refused)})"
