"""The compiled-artifact store: whole compiled graphs kept on disk for the next process.

Takes a key (a hex digest of everything a compiled graph depends on, backends/warm.py) and the
entry's bytes; gives `ArtifactStore.get(key)` and `.put(key, data)`, the size bound with
least-recently-used eviction over the whole kernel cache folder (`evict`), and the cache as one
blob for another machine (`export_blob` / `import_blob`, behind `kiln.save_cache_artifacts` /
`kiln.load_cache_artifacts`).

The same rules as the kernel caches (cache.py), for the same reason (what is read here is
loaded and run):

* `<cache dir>/aot/<2 hex>/<key>.art`, folders created 0700 and refused when another user
  could write them;
* one file per entry, a header line (format, key, byte count, SHA-256) and the bytes: a reader
  sees a whole entry or none, and an entry whose header is missing, foreign, truncated or
  does not match is discarded with a warning and compiled again (two processes that write
  the same entry at once each rename a complete file into place: the last one stays);
* written to a temporary file in the same folder and renamed into place; a write that fails
  (a full disk, a read-only folder) warns once and the run goes on with what it compiled;
* every hit touches the entry's time, and a store past the folder's size bound
  (`KILN_CACHE_MAX_MB`) removes the least recently used entries of every kind (compiled
  graphs, C++ libraries, Triton modules) until it is back under 90% of it.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import io
import json
import os
import platform
import sys

import torch

from .. import logs, options
from ..version import __version__, source_digest
from .cache import CacheUnsafe, _atomic_write, ensure_private_dir

KIND = "aot"
SUFFIX = ".art"
FORMAT = b"kiln-artifact-1"
# every kind of the kernel cache folder and the suffix of its data files (cache_cli, eviction)
KINDS = {"cpp": ".so", "triton": ".py", KIND: SUFFIX}
BLOB_FORMAT = b"kiln-cache-blob-1"


class ArtifactStore:
    def __init__(self, root: str) -> None:
        self.root = root  # the kernel cache folder (cpp/ and triton/ beside aot/)
        self.folder = ensure_private_dir(os.path.join(root, KIND))

    def path(self, key: str) -> str:
        shard = ensure_private_dir(os.path.join(self.folder, key[:2]))
        return os.path.join(shard, key + SUFFIX)

    def get(self, key: str) -> bytes | None:
        """The bytes stored under `key`, or None (a damaged entry is removed: it is rebuilt)."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                raw = f.read()
            st = os.stat(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            logs.warn_once("kiln-artifacts-read", f"kiln cache: cannot read {path}: {e}")
            return None
        data, problem = _unpack(raw, key)
        if problem is None and st.st_uid != os.getuid():
            problem = "file is owned by another user"
        if problem is not None:
            logs.warn(
                f"kiln cache: discarding compiled graph {key[:16]}: {problem}; it is compiled again"
            )
            _remove(path)
            return None
        try:
            os.utime(path)  # its last use, for the eviction order
        except OSError:
            pass
        return data

    def put(self, key: str, data: bytes) -> bool:
        """Store `data` under `key`; False (with one warning a process) when it cannot be
        written: the caller goes on without keeping it."""
        try:
            _atomic_write(self.path(key), _pack(key, data))
        except OSError as e:
            _write_failed(self.folder, e)
            return False
        evict(self.root, options.env_cache_max_bytes())
        return True


def _pack(key: str, data: bytes) -> bytes:
    header = {"key": key, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return FORMAT + b" " + json.dumps(header, sort_keys=True).encode() + b"\n" + data


def _unpack(raw: bytes, key: str) -> tuple[bytes, str | None]:
    line, newline, data = raw.partition(b"\n")
    magic, _, header_text = line.partition(b" ")
    if not newline or magic != FORMAT:
        return b"", "not a kiln artifact of this format"
    try:
        header = json.loads(header_text)
    except ValueError:
        return b"", "header is malformed"
    if header.get("key") != key:
        return b"", "it belongs to another entry"
    if header.get("bytes") != len(data):
        return b"", f"truncated ({len(data)} of {header.get('bytes')} bytes)"
    if header.get("sha256") != hashlib.sha256(data).hexdigest():
        return b"", "content does not match its checksum"
    return data, None


_warned_write = False


def _write_failed(folder: str, e: OSError) -> None:
    global _warned_write
    if not _warned_write:
        _warned_write = True
        what = "the disk is full" if e.errno == errno.ENOSPC else f"{type(e).__name__}: {e}"
        logs.warn(
            f"kiln cache: cannot write a compiled graph into {folder} ({what}); this process "
            "goes on with what it compiled, and a new process compiles it again"
        )


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


@functools.lru_cache(maxsize=None)
def _open(root: str) -> ArtifactStore | None:
    try:
        return ArtifactStore(root)
    except CacheUnsafe as e:
        logs.warn(f"kiln cache: {e}; compiled graphs are not kept for other processes")
    except OSError as e:
        logs.warn(f"kiln cache: cannot use {root} ({e}); compiled graphs are not kept")
    return None


def open_store(root: str | None = None) -> ArtifactStore | None:
    """The store of the kernel cache folder (`KILN_CACHE_DIR`), or None when it cannot be used
    safely (it says why, once)."""
    return _open(root or options.env_cache_dir())


# -- the size bound ---------------------------------------------------------------------------


def entries(root: str):
    """(kind, key, [paths], bytes, last use) of every complete or partial entry in `root`;
    temporary files of killed writers count as entries of their own, unused since written."""
    for kind, suffix in KINDS.items():
        base = os.path.join(root, kind)
        if not os.path.isdir(base):
            continue
        for shard in sorted(os.listdir(base)):
            folder = os.path.join(base, shard)
            if len(shard) != 2 or not os.path.isdir(folder):
                continue
            groups: dict[str, list[str]] = {}
            for name in os.listdir(folder):
                if name.startswith(".tmp-"):
                    groups[name] = [name]
                elif name.endswith((suffix, ".meta")):
                    groups.setdefault(name.rsplit(".", 1)[0], []).append(name)
            for key, names in groups.items():
                paths = [os.path.join(folder, n) for n in names]
                stats = [s for s in map(_stat, paths) if s is not None]
                if stats:
                    used = max(s.st_mtime for s in stats)
                    yield kind, key, paths, sum(s.st_size for s in stats), used


def _stat(path: str):
    try:
        return os.stat(path)
    except OSError:
        return None


def evict(root: str, max_bytes: int) -> int:
    """Remove the least recently used entries of `root` until it holds at most 90% of
    `max_bytes` (nothing while it holds no more than `max_bytes`); gives the bytes removed.
    A library some process has loaded stays mapped there; the next one rebuilds it."""
    found = sorted(entries(root), key=lambda e: e[4])
    total = sum(e[3] for e in found)
    if total <= max_bytes:
        return 0
    removed = 0
    for _, _, paths, size, _ in found:
        if total - removed <= 0.9 * max_bytes:
            break
        for path in paths:
            _remove(path)
        removed += size
    logs.log("perf_hints", f"kiln cache: over {max_bytes / 1e6:.0f} MB, removed {removed} bytes")
    return removed


# -- a cache as one blob ----------------------------------------------------------------------


def environment() -> dict[str, str]:
    """What a shipped cache must match: the code, torch, Python and the machine."""
    from .cpp_builder import _machine

    return {
        "kiln": __version__,
        "kiln_source": source_digest(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "machine": _machine(),
        "platform": platform.platform(terse=True),
    }


def export_blob(root: str | None = None) -> bytes:
    """Every complete entry of the cache folder (compiled graphs, C++ libraries, Triton
    modules) as one blob, headed by `environment()`."""
    root = root or options.env_cache_dir()
    files = []
    for kind, _, paths, _, _ in entries(root):
        for path in paths:
            name = os.path.basename(path)
            if name.startswith(".tmp-"):
                continue
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            files.append((f"{kind}/{name[:2]}/{name}", data))
    header = {"environment": environment(), "files": [[p, len(d)] for p, d in files]}
    out = io.BytesIO()
    out.write(BLOB_FORMAT + b" " + json.dumps(header, sort_keys=True).encode() + b"\n")
    for _, data in files:
        out.write(data)
    return out.getvalue()


class BlobRefused(ValueError):
    """A blob from another kiln, torch, Python or machine, or not a kiln cache blob at all."""


def import_blob(blob: bytes, root: str | None = None) -> int:
    """Write a blob's entries into the cache folder; gives how many files. A blob made by other
    code or on another kind of machine raises `BlobRefused`, naming what differs."""
    line, newline, body = bytes(blob).partition(b"\n")
    magic, _, header_text = line.partition(b" ")
    if not newline or magic != BLOB_FORMAT:
        raise BlobRefused(
            "kiln.load_cache_artifacts: this is not a blob kiln.save_cache_artifacts() made"
        )
    header = json.loads(header_text)
    theirs, ours = header["environment"], environment()
    differ = [k for k in ours if theirs.get(k) != ours[k]]
    if differ:
        what = "; ".join(f"{k}: blob {theirs.get(k)!r}, here {ours[k]!r}" for k in differ)
        raise BlobRefused(
            f"kiln.load_cache_artifacts: the blob was saved by another setup ({what}). "
            "Compiled artifacts carry over only between the same kiln, torch and Python on the "
            "same kind of machine; this one compiles afresh instead."
        )
    root = ensure_private_dir(root or options.env_cache_dir())
    offset = 0
    for rel, size in header["files"]:
        data = body[offset : offset + size]
        offset += size
        if len(data) != size:
            raise BlobRefused("kiln.load_cache_artifacts: the blob is truncated")
        kind, shard, name = rel.split("/")
        if kind not in KINDS or len(shard) != 2 or "/" in name or name.startswith("."):
            raise BlobRefused(f"kiln.load_cache_artifacts: unexpected entry {rel!r} in the blob")
        folder = ensure_private_dir(
            os.path.join(ensure_private_dir(os.path.join(root, kind)), shard)
        )
        _atomic_write(os.path.join(folder, name), data)
    return len(header["files"])
