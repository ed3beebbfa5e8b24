"""The arena blocks compiled graphs keep between calls (schedule/arena.py plans what they hold).

Takes a byte count; gives a block (`new_block`, the wrapper's `_new_arena`), and `held_bytes()`:
what every block alive in this process holds, the figure a memory measure adds to what one call
allocates (`kiln bench`'s CPU peak). A weak reference to each block is kept, nothing more.

Why it exists: it is what a loaded wrapper calls at run time, so it lives apart from the
planner (which imports loop IR and sympy), and loading a cached graph imports neither.
"""

from __future__ import annotations

import itertools
import weakref

import torch

_blocks: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id -> live block
_block_ids = itertools.count()


def new_block(nbytes: int) -> torch.Tensor:
    """A graph's arena block, counted by `held_bytes` while it is alive."""
    block = torch.empty(nbytes, dtype=torch.uint8, device="cpu")
    _blocks[next(_block_ids)] = block
    return block


def held_bytes() -> int:
    """Bytes of every arena block alive in this process: those compiled graphs keep between
    calls, and any a running call holds."""
    return sum(block.nbytes for block in list(_blocks.values()))
