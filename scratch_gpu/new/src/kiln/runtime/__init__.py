"""runtime/: build, load and cache compiled artifacts.

In: C++ source text and its kernel names. Out: a loaded library of `ctypes` functions.
Files: cpp_builder.py (compiler discovery, flags, cache keys, loading), cache.py (the per-user,
content-addressed, checksummed on-disk cache with atomic writes).
"""

from .cache import ArtifactCache, CacheUnsafe
from .cpp_builder import STATS, BuildError, CompilerNotFound, build, find_compiler

__all__ = [
    "STATS",
    "ArtifactCache",
    "BuildError",
    "CacheUnsafe",
    "CompilerNotFound",
    "build",
    "find_compiler",
]
