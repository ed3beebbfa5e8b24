"""Python code objects across processes: a stable digest of compiled code, and code kept as bytes.

Takes code objects (a user function's `__code__`) or generated Python source (a wrapper program,
a residual entry, a guard function); gives

* `code_digest(code)`: a SHA-256 of compiled code that is the same in every process running the
  same source. `marshal.dumps(code)` is not: a frozenset constant (`x in {"a", "b"}`) is written
  in its iteration order, which follows string hashing, randomized per process, so a key made
  of marshal's bytes missed the cache in every other process.
* `dump(code)` and `load(blob, source, filename)`: a code object as bytes kept beside its
  source in a cache entry, and back without compiling. The bytes are marshal's,
  tagged with the interpreter's bytecode magic number; another interpreter (or bytes that do
  not read) compiles the source instead. A warm start loads several generated programs (a
  GPT-2 forward's wrapper is thousands of lines): compiling them was a tenth of its first call.

Why it exists: the capture cache (capture/recipes.py) and the artifact cache (backends/warm.py)
must name functions the same way, and capture may not import backends: both import this base
module.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import types
from typing import Any

_MAGIC = importlib.util.MAGIC_NUMBER  # changes with the bytecode format (Python version)

_CODE_FIELDS = (
    "co_argcount",
    "co_posonlyargcount",
    "co_kwonlyargcount",
    "co_flags",
    "co_names",
    "co_varnames",
    "co_freevars",
    "co_cellvars",
    "co_filename",
    "co_name",
    "co_qualname",
    "co_firstlineno",
)


def code_digest(code: types.CodeType) -> str:
    """A digest of compiled code that is the same in every process (see the module doc):
    bytecode, exception table, names, nested code, and constants with frozensets sorted."""
    h = hashlib.sha256()
    _hash_code(code, h)
    return h.hexdigest()


def _hash_code(code: types.CodeType, h: Any) -> None:
    h.update(code.co_code)
    h.update(code.co_exceptiontable)
    h.update(repr([getattr(code, f) for f in _CODE_FIELDS]).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            h.update(b"<code>")
            _hash_code(c, h)
        else:
            h.update(_const_text(c).encode() + b"\0")


def _const_text(c: Any) -> str:
    if isinstance(c, frozenset):
        return f"frozenset({sorted(map(_const_text, c))!r})"
    if isinstance(c, tuple):
        return "(" + ",".join(map(_const_text, c)) + ")"
    return f"{type(c).__name__}:{c!r}"


def dump(code: types.CodeType) -> bytes:
    """`code` as bytes for a cache entry (`load` reads them back)."""
    return _MAGIC + marshal.dumps(code)


def load(blob: bytes | None, source: str, filename: str) -> types.CodeType:
    """The code `blob` (from `dump`) holds when this interpreter wrote it and it is the code of
    `source` as `filename`; else `source` compiled."""
    if blob and blob[: len(_MAGIC)] == _MAGIC:
        try:
            code = marshal.loads(blob[len(_MAGIC) :])
        except (ValueError, EOFError, TypeError):
            code = None
        if isinstance(code, types.CodeType) and code.co_filename == filename:
            return code
    return compile(source, filename, "exec")
