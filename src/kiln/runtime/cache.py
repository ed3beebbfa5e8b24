"""The on-disk artifact cache: content-addressed, per user, written atomically, checked on read.

Takes a cache directory (default `kiln.options.env_cache_dir()`), a key (a hex digest of
everything that determines an artifact) and artifact bytes; gives `lookup(key)` and
`store(key, data)`.

Safety rules, because a cache entry is a shared library that gets loaded into the process:

* the directory is created with mode 0700 and must be owned by the current user and not
  writable by group or others, else `CacheUnsafe` (the builder then uses a private temporary
  directory and says so);
* an entry is `<key>.so` plus `<key>.meta`, a line naming the key, the byte count and the
  SHA-256 of the library; a lookup re-hashes the file and discards an entry whose metadata is
  missing, truncated, foreign (another key) or does not match — it is rebuilt, never loaded;
* writes go to a temporary file in the same directory and are renamed into place, library
  first and metadata last, so a reader sees a complete entry or none;
* processes share a cache (torchrun's ranks, one `KILN_CACHE_DIR`): a process that misses
  takes an exclusive lock on `<key>.lock` (flock), looks again, and only then deletes a bad
  entry or builds and stores the artifact. So a library is never deleted while another
  process is between writing it and its metadata (a missing metadata file is that writer's
  entry in progress, not damage), and ranks that want the same kernel at once build it once:
  the others wait for the lock and load what the first stored.

Why it exists: nothing is compiled twice (DESIGN.md §2), and a cache must never be a way to
load a file someone else put there.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
import tempfile

from .. import logs

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process lock (one process per cache there)
    fcntl = None  # type: ignore[assignment]

META_VERSION = "kiln-cache-1"


class CacheUnsafe(Exception):
    """The cache directory could be written by another user; it is not used."""


def ensure_private_dir(path: str) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.getuid():
        raise CacheUnsafe(f"cache directory {path} is owned by uid {st.st_uid}, not by you")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheUnsafe(
            f"cache directory {path} is writable by group or others (mode "
            f"{stat.filemode(st.st_mode)}); fix with: chmod 700 {path}"
        )
    return path


@functools.lru_cache(maxsize=None)
def open_cache(root: str, kind: str, suffix: str = ".so") -> ArtifactCache:
    """The cache of one kind of artifact, `<root>/<kind>`; when that directory is unsafe, a
    private temporary one for this process instead, with a warning saying so."""
    try:
        return ArtifactCache(os.path.join(root, kind), suffix=suffix)
    except CacheUnsafe as e:
        private = tempfile.mkdtemp(prefix="kiln-cache-")
        logs.warn(f"kiln cache: {e}; using the private directory {private} for this process")
        return ArtifactCache(private, suffix=suffix)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ArtifactCache:
    def __init__(self, root: str, suffix: str = ".so") -> None:
        self.root = ensure_private_dir(root)
        self.suffix = suffix

    def paths(self, key: str) -> tuple[str, str]:
        sub = ensure_private_dir(os.path.join(self.root, key[:2]))
        return os.path.join(sub, key + self.suffix), os.path.join(sub, key + ".meta")

    def lookup(self, key: str) -> str | None:
        """The path of a verified entry for `key`, or None (a bad entry is deleted: call it
        holding `locked(key)`, or another process's entry in progress may look bad)."""
        lib, meta = self.paths(key)
        if not os.path.exists(lib) and not os.path.exists(meta):
            return None
        problem = self._check(key, lib, meta)
        if problem is None:
            try:
                os.utime(meta)  # its last use, for the size bound's eviction (artifacts.py)
            except OSError:
                pass
            return lib
        logs.warn(f"kiln cache: discarding entry {key[:16]}: {problem}; it will be rebuilt")
        for p in (lib, meta):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        return None

    def _check(self, key: str, lib: str, meta: str) -> str | None:
        try:
            with open(meta) as f:
                fields = f.read().split()
            st = os.stat(lib)
            with open(lib, "rb") as f:
                data = f.read()
        except OSError as e:
            return f"unreadable ({e.__class__.__name__})"
        if len(fields) != 4 or fields[0] != META_VERSION:
            return "metadata is missing or malformed"
        if fields[1] != key:
            return "metadata belongs to another entry"
        if st.st_uid != os.getuid():
            return "file is owned by another user"
        if int(fields[2]) != len(data):
            return f"truncated ({len(data)} of {fields[2]} bytes)"
        if fields[3] != _digest(data):
            return "content does not match its checksum"
        return None

    def verified(self, key: str) -> str | None:
        """The path of a verified entry for `key`, or None; deletes nothing (no lock needed)."""
        lib, meta = self.paths(key)
        if not os.path.exists(meta):
            return None
        return lib if self._check(key, lib, meta) is None else None

    @contextlib.contextmanager
    def locked(self, key: str):
        """Exclusive use of `key`'s entry among the processes sharing this cache."""
        lib, _ = self.paths(key)
        fd = os.open(lib.rsplit(".", 1)[0] + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)  # released by close, or by the OS on death
            yield
        finally:
            os.close(fd)

    def fetch(self, key: str, produce) -> tuple[str, bool]:
        """(path of the entry for `key`, whether it was already on disk); `produce()` gives the
        bytes of a missing entry, which is then stored. Safe for processes sharing the cache
        (see the module doc): the miss is settled under the key's lock."""
        path = self.verified(key)
        if path is not None:
            return path, True
        with self.locked(key):
            path = self.lookup(key)
            if path is not None:
                return path, True
            return self.store(key, produce()), False

    def store(self, key: str, data: bytes) -> str:
        lib, meta = self.paths(key)
        _atomic_write(lib, data)
        _atomic_write(meta, f"{META_VERSION} {key} {len(data)} {_digest(data)}\n".encode())
        return lib


def _atomic_write(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
