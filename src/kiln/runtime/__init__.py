"""runtime/: build, load, cache and launch compiled artifacts; device graphs.

In: generated source (C++ for the cpu device, a Triton module for cuda) and what its kernels
take. Out: loaded kernels (ctypes functions, Triton kernels with fast launches) and, for
reduce-overhead, callables that capture and replay device graphs.

Files:
  cache.py                  the per-user, content-addressed, checksummed on-disk cache
  artifacts.py              compiled graphs kept for the next process (the warm start's store),
                            the cache folder's size bound, the cache as one blob
  arenas.py                 the arena blocks compiled graphs keep between calls
  cache_cli.py              `kiln cache info|clear`
  cpp_builder.py            C++ source -> loaded shared library (flags, cache keys)
  triton_builder.py         Triton module source -> imported module, compiled ahead in workers
  triton_cached.py          a warm process's kernels straight from Triton's cache (no JITFunction)
  triton_workers.py         the pool of compile worker processes (triton_worker_main.py: a worker)
  triton_launch.py          fast launches of compiled Triton kernels (FastKernel)
  triton_native_launcher.py Triton kernels launched through the native module's one launch
  triton_interpret.py       NumPy libdevice for Triton's interpreter (the CPU tests)
  device_graphs.py          capture and replay of device graphs (CUDA graphs), graph trees
  device_graphs_outputs.py  replay outputs that say when a later replay overwrote them
The native module (guard tables, views, the generic launch) is `kiln.native`, a base module:
capture uses it too.
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
