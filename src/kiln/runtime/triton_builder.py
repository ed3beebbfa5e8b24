"""The Triton builder: generated module source -> an imported module of compiled kernels.

Takes the Python source of one graph's Triton kernels (codegen/triton) and what each kernel is
launched with; gives the imported module, whose attributes are the `@triton.jit` kernels.

* The source is written to the kiln cache directory (`<cache>/triton/<key>.py`, through the
  same checked, atomic artifact cache the C++ builder uses) and imported from there: Triton
  reads a kernel's source with `inspect`, so it has to live in a real file. The key hashes the
  source with the kiln, torch, Triton and Python versions; an identical graph reuses the file
  and, within a process, the imported module (nothing is loaded twice).
* Compiled binaries are cached on disk by Triton itself, keyed by content and device. When a
  GPU is present, the kernels are compiled ahead of the first launch
  in parallel worker processes (triton_workers.py), which fill that cache: the parent asks
  Triton how each launch will be specialized (`specializations`, no compiling) and the
  workers compile exactly that, and build the kernels' C launchers (unless kiln's generic
  native launch takes the kernels: triton_native_launcher.py), without importing torch.
  Each worker reports its kernel's Triton cache hash; the parent loads the binaries by those
  hashes (`_preload`), so it never hashes Triton's own files for a cache key. The hashes are
  recorded in kiln's cache (`triton-hashes/`): a later process (a warm start) loads kernels
  compiled before straight from Triton's cache by them and starts no worker at all; when
  every kernel of the module is recorded with its launch plan, it does not even import the
  module or ask Triton's binder anything (triton_cached.py). A worker failure is not an
  error: the parent compiles that kernel itself at its first launch.
* Under `TRITON_INTERPRET=1` nothing is compiled; the module's `libdevice` is replaced by the
  NumPy stand-in of runtime/triton_interpret.py.

Why it exists: the builder half of the cuda device (STYLE.md item 5); it knows files,
processes and Triton's compiler, nothing about kernels.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
import time
from typing import Callable

import torch

from .. import logs, options, trace
from ..version import __version__ as kiln_version
from . import triton_cached, triton_native_launcher, triton_workers
from .cache import open_cache
from .triton_interpret import is_interpreting, scalar_loop_bounds

# Compile in workers even a module of one kernel: the inductor backend has started them while
# the graph was traced (a worker is ready about half a second after it starts, which overlaps
# lowering and scheduling), the parent then never hashes Triton's files for a cache key
# (`_preload`), and only what a worker compiled is recorded for a later process, which then
# loads it with no JITFunction (triton_cached.py).
PARALLEL_MIN_KERNELS = 1
MAX_WORKERS = 16  # a ResNet-50's 49 kernels kept 8 workers busy 4.7 s on the 16-CPU H200 host

_loaded: dict[str, object] = {}
STATS = {"loads": 0, "memory_hits": 0, "disk_hits": 0, "warmed": 0, "warm_seconds": 0.0}
STATS["preloaded"] = 0  # kernels the workers compiled that the parent loaded by hash
# kernels compiled in an earlier process, loaded by recorded hash without any worker
STATS["loaded_by_hash"] = 0
# kernels a warm process loaded from Triton's cache with no JITFunction (triton_cached.py)
STATS["loaded_from_cache"] = 0
# The last parallel compile (`benchmarks/compile_profile.py` prints them): seconds from the
# pool's start until the parent handed out kernels and until the last worker was ready; the
# slowest kernel's compile seconds, and all kernels' compile seconds added up.
STATS.update(run_after_s=0.0, workers_ready_s=0.0, slowest_kernel_s=0.0, kernel_seconds=0.0)


class TritonNotFound(RuntimeError):
    pass


def require_triton():
    """The `triton` package, or `TritonNotFound` saying how to get it."""
    try:
        import triton
        import triton.language  # noqa: F401
    except ImportError as e:
        raise TritonNotFound(
            f"kiln's GPU code generator needs Triton ({e}). Fix: `pip install triton` "
            "(or `pip install kiln[gpu]`), or use backend='aot_eager'."
        ) from None
    return triton


def cache_key(source: str) -> str:
    triton = require_triton()
    interp = "interpret" if is_interpreting() else "compile"
    parts = [source, kiln_version, torch.__version__, triton.__version__, sys.version, interp]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _import(path: str, key: str):
    name = f"kiln_triton_{key[:24]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Triton resolves a kernel's globals through its module
    spec.loader.exec_module(module)
    if is_interpreting():
        module.libdevice = _interpreter_libdevice()
        scalar_loop_bounds()
    return module


@functools.lru_cache(maxsize=None)
def _interpreter_libdevice():
    from .triton_interpret import make_libdevice

    return make_libdevice()


@trace.timed("build")
def load(
    source: str, launches: dict | None = None, cache_dir: str | None = None, wait: bool = True
):
    """Import (writing it if needed) the module of `source`. `launches` maps kernel names to
    (argument dtypes, an int for a size argument; grid, constexprs, num_warps), used to
    compile kernels ahead in parallel;
    `wait=False`: return while the workers compile them (`finish_compiles(module)` waits; the
    Triton code generator's compiled graph does at its first call)."""
    key = cache_key(source)
    hit = _loaded.get(key)
    if hit is not None:
        STATS["memory_hits"] += 1
        trace.event("cache", kind="triton", key=key, result="memory")
        return hit
    cache = open_cache(cache_dir or options.env_cache_dir(), "triton", suffix=".py")
    path, on_disk = cache.fetch(key, lambda: source.encode())
    STATS["disk_hits"] += on_disk
    trace.event("cache", kind="triton", key=key, result="disk" if on_disk else "compiled")
    module = _cached(path, key, source, launches) if on_disk else None
    if module is not None:
        _loaded[key] = module
        return module
    module = _import(path, key)
    STATS["loads"] += 1
    if launches and not is_interpreting():
        finish = warm(path, module, launches)
        if finish is not None and wait:
            finish()
        elif finish is not None:
            _pending[module.__name__] = finish
    _loaded[key] = module
    return module


def _cached(path: str, key: str, source: str, launches: dict | None):
    """The module's kernels straight from Triton's cache, when the compile workers recorded
    every one in an earlier process (triton_cached.py), or None. A launch the record does not
    vouch for imports the module then, its kernels preloaded from the recorded hashes."""
    if not launches or is_interpreting() or not torch.cuda.is_available():
        return None
    known = _built_hashes(path)

    def import_module():
        module = _import(path, key)
        STATS["loads"] += 1
        for name in launches:
            record = known.get(name)
            if record is not None and len(record) >= 4:
                _preload(getattr(module, name), record[3], record[1])
        return module

    module = triton_cached.load(source, launches, known, import_module)
    if module is not None:
        STATS["loaded_from_cache"] += len(launches)
    return module


_pending: dict[str, Callable[[], None]] = {}  # module name -> wait for its parallel compile


def compiling(module) -> bool:
    """Whether `module`'s kernels are still being compiled by the workers."""
    return module.__name__ in _pending


def finish_compiles(module=None) -> None:
    """Wait for the parallel compile of `module`'s kernels (of every module's, when None)."""
    names = [module.__name__] if module is not None else list(_pending)
    for name in names:
        finish = _pending.pop(name, None)
        if finish is not None:
            finish()


# ---------------------------------------------------------------------------------------------
# Parallel ahead-of-time compilation
# ---------------------------------------------------------------------------------------------


def _workers() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_WORKERS, cpus or 1))


def prestart() -> None:
    """Launch the compile workers now (a GPU graph is about to be compiled), so that their
    start-up overlaps lowering and scheduling."""
    if torch.cuda.is_available() and not is_interpreting():
        if importlib.util.find_spec("triton") is not None:  # else: said when the graph compiles
            triton_workers.start(_workers(), _target())


def _hash_triton() -> None:
    """Triton's hash of its own files, part of every cache key and computed once a process
    (~0.4 s on the H200 host), run while the workers compile when the parent will compile some
    kernel itself (one without a specialization; the others it loads by hash, `_preload`).
    Not in a thread beside lowering: it reads and hashes libtriton in a few hundred chunks,
    each giving up the GIL and waiting up to a switch interval to get it back (2.5 s in all
    for BERT)."""
    try:
        from triton.runtime.cache import triton_key

        triton_key()
    except Exception:  # the first launch meets it again and reports it
        pass


def _preload(jit, specialization: str, kernel_hash: str) -> bool:
    """Put the kernel a worker compiled for `specialization` into `jit`'s in-memory cache, read
    from Triton's disk cache under the hash the worker reported, as Triton's `compile` reads a
    cache hit. The first launch then finds it there. Otherwise that launch's `compile` would
    compute the cache key, which hashes Triton's own files (`triton_key`: libtriton is 415 MB,
    about 0.4 s on the H200 host, once a process): the workers have computed it already. Only
    `compile` of this one `JITFunction` is replaced, during `JITFunction.preload`, which
    computes the same in-memory key as a launch with that specialization. Anything unexpected
    leaves the cache as it was (the first launch then compiles the usual way); gives whether
    the kernel was loaded."""
    try:
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.cache import get_cache_manager
    except ImportError:
        return False

    def load(src, target=None, options=None, **_):
        name = f"{src.name}.json"
        group = get_cache_manager(kernel_hash).get_group(name) or {}
        if name not in group:
            raise LookupError(f"{name} is not in Triton's cache under {kernel_hash}")
        return CompiledKernel(src, group, kernel_hash)

    original = jit.compile
    jit.compile = load
    try:
        return jit.preload(specialization) is not None
    except Exception:
        return False
    finally:
        jit.compile = original


def _target() -> list | None:
    """The current CUDA device as Triton names it (`GPUTarget`'s fields), or None (ROCm)."""
    if torch.version.hip is not None:
        return None
    major, minor = torch.cuda.get_device_capability()
    return ["cuda", major * 10 + minor, 32]


def specializations(module, launches: dict) -> dict[str, str]:
    """{kernel: the JSON Triton builds for that launch} — argument types, constexprs, alignment
    attributes and options — got through `JITFunction.warmup` with a `jit_cache_hook` that
    stops before compiling. A worker compiles exactly that (triton_worker_main.py). Kernels
    Triton says nothing for are left out (they compile the fallback way), all of them with a
    Triton that has no such hook."""
    import triton

    if getattr(getattr(triton, "knobs", None), "runtime", None) is None:
        return {}
    # keyed by id: a `JITFunction`'s hash is its `cache_key`, which parses the kernel's source
    # and walks its syntax tree (0.17 s under cProfile for a training step's 18 kernels on the
    # H200 host, on the critical path); nothing else in the parent needs that key
    ours = {id(getattr(module, name)): name for name in launches}
    seen: dict[str, str] = {}
    runtime = triton.knobs.runtime
    previous = runtime.jit_cache_hook

    def hook(*, fn, compile, **kwargs):
        name = ours.get(id(fn.jit_function))
        if name is None:  # another thread's kernel: not ours to stop
            return previous(fn=fn, compile=compile, **kwargs) if previous else None
        seen[name] = compile["specialization_data"]
        return True

    runtime.jit_cache_hook = hook
    try:
        for name, (dts, grid, consts, warps) in launches.items():
            try:
                getattr(module, name).warmup(*dts, grid=tuple(grid), num_warps=warps, **consts)
            except Exception:
                seen.pop(name, None)
    finally:
        runtime.jit_cache_hook = previous
    return seen


def warm(path: str, module, launches: dict) -> Callable[[], None] | None:
    """Hand the kernels of `module` (imported from `path`) to the worker processes (see module
    doc); gives the function that waits for them, or None when they are not compiled there.
    Kernels a worker compiled before (in any process: `_built_hashes`) are loaded from
    Triton's cache by their recorded hashes instead, and when that is every kernel no worker
    starts (a warm start's loads cost no pool, no Triton key)."""
    if len(launches) < PARALLEL_MIN_KERNELS or not torch.cuda.is_available():
        return None
    start = time.perf_counter()
    specs = specializations(module, launches)
    known = _built_hashes(path)
    plans = dict(launches)
    preloaded = {}
    for name, spec in specs.items():
        recorded = known.get(name)
        if recorded and recorded[0] == _digest(spec):
            if _preload(getattr(module, name), spec, recorded[1]):
                preloaded[name] = triton_cached.record_of(spec, recorded[1], plans[name])
    STATS["preloaded"] += len(preloaded)
    STATS["loaded_by_hash"] += len(preloaded)
    launches = {name: plan for name, plan in launches.items() if name not in preloaded}
    if not launches:
        if any(known.get(name) != record for name, record in preloaded.items()):
            _remember_hashes(path, preloaded)  # an older record: the next process needs no JIT
        STATS["warm_seconds"] += time.perf_counter() - start
        return None
    # kiln's native launch takes these kernels: no worker builds Triton's C launchers for them
    launchers = not triton_native_launcher.available()
    jobs = [
        {
            "path": path,
            "kernel": name,
            "specialization": specs.get(name),
            # (an int is a size argument's value, passed as it is)
            "dtypes": [d if isinstance(d, int) else str(d).replace("torch.", "") for d in dts],
            "grid": list(grid),
            "constexprs": consts,
            "num_warps": warps,
            "launcher": launchers,
        }
        for name, (dts, grid, consts, warps) in launches.items()
    ]
    # the longest kernels first: with more kernels than workers, a long one handed out last
    # would finish alone (a ResNet-50's 18 kernels on 16 workers)
    jobs.sort(key=lambda job: -len(getattr(getattr(module, job["kernel"]), "src", "")))
    try:
        pool = triton_workers.start(_workers(), _target())
        STATS["run_after_s"] = time.time() - pool.started
        ids = pool.submit(jobs)
    except Exception as e:  # no workers at all: the parent compiles at first launch
        logs.log("perf_hints", f"no Triton compile workers ({e!r}); compiling inline")
        return None
    STATS["warm_seconds"] += time.perf_counter() - start

    # every kernel compiled from a specialization: the parent loads them by their hashes and
    # never needs Triton's own key (`_preload`), so it does not compute it meanwhile
    every_spec = all(job["specialization"] for job in jobs)

    def finish() -> None:
        begin = time.perf_counter()
        job_of = dict(zip(ids, jobs))
        built = dict(preloaded)
        # each kernel is loaded as soon as its worker is done, while the others still compile
        for job_id, error in pool.as_completed(ids, None if every_spec else _hash_triton):
            if error is not None:
                logs.log(
                    "perf_hints",
                    f"parallel Triton compile of {job_id} failed ({error}); compiling inline",
                )
                continue
            STATS["warmed"] += 1
            kernel_hash = pool.hashes.get(job_id)
            job = job_of[job_id]
            if kernel_hash and job["specialization"]:
                jit = getattr(module, job["kernel"])
                if _preload(jit, job["specialization"], kernel_hash):
                    STATS["preloaded"] += 1
                    built[job["kernel"]] = triton_cached.record_of(
                        job["specialization"], kernel_hash, plans[job["kernel"]]
                    )
        _record(pool, ids)
        _remember_hashes(path, built)
        STATS["warm_seconds"] += time.perf_counter() - begin

    return finish


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _hashes_key(path: str) -> str:
    """The record of the Triton cache hashes of a kernel module's kernels: per module file
    (its name is its source's key), GPU target and Triton settings of the environment."""
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("TRITON_"))
    env = [(k, v) for k, v in env if k != "TRITON_CACHE_DIR"]
    return _digest(repr((os.path.basename(path), _target(), env)))


def _built_hashes(path: str) -> dict[str, list[str]]:
    """{kernel: [digest of its specialization, its Triton cache hash, digest of its launch plan,
    the specialization]} (`triton_cached.record_of`) as workers reported them
    for `path`'s module in this or an earlier process; {} when none were recorded. A hash only
    says where to look: `_preload` loads the binary only if Triton's cache still has it."""
    cache = open_cache(options.env_cache_dir(), "triton-hashes", suffix=".json")
    found = cache.verified(_hashes_key(path))
    if found is None:
        return {}
    try:
        with open(found) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _remember_hashes(path: str, built: dict[str, list[str]]) -> None:
    """Record the hashes of `path`'s kernels that are in Triton's cache (`_built_hashes`)."""
    if not built:
        return
    try:
        cache = open_cache(options.env_cache_dir(), "triton-hashes", suffix=".json")
        cache.store(_hashes_key(path), json.dumps(built, sort_keys=True).encode())
    except OSError as e:  # a full disk: the next process starts the workers again
        logs.log("perf_hints", f"could not record Triton kernel hashes ({e!r})")


def _record(pool, ids: list[str]) -> None:
    seconds = [pool.seconds[i] for i in ids if i in pool.seconds]
    STATS["workers_ready_s"] = max(pool.ready_after.values(), default=0.0)
    STATS["slowest_kernel_s"] = max(seconds, default=0.0)
    STATS["kernel_seconds"] = sum(seconds)
    logs.log(
        "perf_hints",
        lambda: (
            f"compiled {len(seconds)} Triton kernels in {len(pool.channels)} "
            f"workers: ready {STATS['workers_ready_s']:.2f} s after start, slowest kernel "
            f"{STATS['slowest_kernel_s']:.2f} s, {STATS['kernel_seconds']:.2f} s in all"
        ),
    )


def shutdown(wait: bool = True) -> None:
    """Stop the compile workers: the inductor backend does once each captured graph is
    compiled (tests and `kiln.reset()` may too); the next graph to compile starts them again,
    in the background as before. Idle, they would cost every later call: each holds a CUDA
    context, and with the 16 of the H200 host alive a reduce-overhead GPT-2 decode step took
    822-853 us from an idle device against 610-626 us once they were stopped (ResNet-50:
    2069-2219 against 1847-1988 us; they held CUDA contexts then, they do not now). Kernels
    still being compiled are waited for first. `wait=False`: do not wait for them to exit."""
    finish_compiles()
    triton_workers.shutdown(wait)
