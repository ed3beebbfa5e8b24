"""The C++ builder: source text -> a loaded shared library, cached by content.

Takes C++ source (one translation unit per graph) and the names of its kernels; gives a
`LoadedLibrary` whose attributes are `ctypes` functions taking raw pointers. The key of a
library hashes the source, the compiler command and version, the kiln, torch and Python
versions and the machine, so a changed compiler or flag never reuses a stale binary.

Lookup order: the in-process table, then the on-disk cache (runtime/cache.py), then the
compiler. A missing compiler raises `CompilerNotFound` with the fix; callers fall back to eager.

Why it exists: the builder half of the cpu device (STYLE.md item 5); it knows compilers and
files, nothing about kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch

from .. import options, trace
from ..native.compiler import COMPILERS, CompilerNotFound, find_compiler  # noqa: F401
from ..version import __version__ as kiln_version
from .cache import open_cache

FLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fPIC",
    "-shared",
    "-std=c++17",
    "-fwrapv",
    "-fno-math-errno",
    "-w",
)
if platform.machine() == "x86_64":
    # Full-width vectors where the CPU has AVX-512 (as ATen's kernels use them); GCC otherwise
    # stops at 256 bits. No effect on CPUs without AVX-512.
    FLAGS += ("-mprefer-vector-width=512",)
if sys.platform == "linux" and platform.machine() == "x86_64":
    FLAGS += ("-lmvec",)  # vector exp/log for the prelude's `simd` declarations

_loaded: dict[str, LoadedLibrary] = {}
STATS = {"compiles": 0, "disk_hits": 0, "memory_hits": 0, "compile_seconds": 0.0}


class BuildError(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
@functools.lru_cache(maxsize=None)
def _machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    model += line
    except OSError:
        pass
    return platform.machine() + hashlib.sha256(model.encode()).hexdigest()[:16]


def cache_key(source: str) -> str:
    path, version = find_compiler()
    parts = [
        source,
        path,
        version,
        " ".join(FLAGS),
        kiln_version,
        torch.__version__,
        sys.version.split()[0],
        _machine(),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


class LoadedLibrary:
    def __init__(self, path: str, kernels: dict[str, int]) -> None:
        self.path = path
        self._lib = ctypes.CDLL(path)
        for name, nargs in kernels.items():
            fn = getattr(self._lib, name)
            fn.argtypes = [ctypes.c_void_p] * nargs
            fn.restype = None
            setattr(self, name, fn)


def _compile(source: str) -> bytes:
    path, _ = find_compiler()
    with tempfile.TemporaryDirectory(prefix="kiln-build-") as tmp:
        src, lib = os.path.join(tmp, "kernels.cpp"), os.path.join(tmp, "kernels.so")
        with open(src, "w") as f:
            f.write(source)
        cmd = [path, *FLAGS, src, "-o", lib]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        STATS["compile_seconds"] += time.perf_counter() - start
        STATS["compiles"] += 1
        if proc.returncode != 0:
            raise BuildError(
                f"C++ compile failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}\n"
                "This is a kiln bug; please report it with the source above "
                "(KILN_LOGS=output_code prints it)."
            )
        with open(lib, "rb") as f:
            return f.read()


@trace.timed("build")
def build(source: str, kernels: dict[str, int], cache_dir: str | None = None) -> LoadedLibrary:
    """Load (compiling if needed) `source`; `kernels` maps kernel names to argument counts."""
    key = cache_key(source)
    hit = _loaded.get(key)
    if hit is not None:
        STATS["memory_hits"] += 1
        trace.event("cache", kind="cpp", key=key, result="memory")
        return hit
    cache = open_cache(cache_dir or options.env_cache_dir(), "cpp")
    path, on_disk = cache.fetch(key, lambda: _compile(source))
    STATS["disk_hits"] += on_disk
    trace.event("cache", kind="cpp", key=key, result="disk" if on_disk else "compiled")
    lib = LoadedLibrary(path, kernels)
    _loaded[key] = lib
    return lib
