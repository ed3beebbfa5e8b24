"""kiln's version, in its own module: caches key on it; no stage imports the package root.

`source_digest()` names the exact code running: a hash of every `.py` file of the installed
package. The compiled-artifact cache keys on it rather than on `__version__`, which stays the
same while the code changes (a checkout, an edit), so a graph compiled by other code is never
loaded; two machines with the same kiln get the same digest, so a shipped cache
(`kiln.save_cache_artifacts`) carries over.
"""

from __future__ import annotations

import functools
import hashlib
import os

__version__ = "0.1.0"


@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    return digest_of(os.path.dirname(os.path.abspath(__file__)))


def digest_of(root: str) -> str:
    """The digest of every `.py` file under `root` (paths and contents). Reading and hashing
    them all (several megabytes) was a measurable part of a warm start's first call, so the
    digest is kept in kiln's cache folder under the files' identities (paths, sizes,
    modification times), which a listing gives; a file changed since has another identity."""
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        for name in sorted(f for f in names if f.endswith(".py")):
            path = os.path.join(folder, name)
            st = os.stat(path)
            files.append((os.path.relpath(path, root), path, st.st_size, st.st_mtime_ns))
    ident = repr([(rel, size, mtime) for rel, _, size, mtime in files]) + root
    kept = _kept_path(hashlib.sha256(ident.encode()).hexdigest()[:32])
    found = _read(kept) if kept else None
    if found is not None:
        return found
    digest = hashlib.sha256(__version__.encode())
    for rel, path, _, _ in files:
        with open(path, "rb") as f:
            data = f.read()
        digest.update(rel.encode() + b"\0" + data + b"\0")
    value = digest.hexdigest()
    if kept:
        write_kept(kept, value)
    return value


def _kept_path(name: str) -> str | None:
    from .options import env_cache_dir

    try:
        return os.path.join(env_cache_dir(), "source-digests", name)
    except Exception:  # noqa: BLE001 - no cache folder: computed every time
        return None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            value = f.read()
    except OSError:
        return None
    return value if len(value) == 64 and all(c in "0123456789abcdef" for c in value) else None


def write_kept(path: str, value: str) -> None:
    """Keep `value` in the cache file `path` for later processes (the source digest here, the
    compiler's version line in native/compiler.py); a failure only means it is computed again."""
    try:  # written whole under another name, then renamed: a reader never sees a part
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(value)
        os.replace(tmp, path)
    except OSError:  # a read-only or full cache folder: computed again next time
        pass
