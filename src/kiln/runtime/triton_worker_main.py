"""Triton compile workers: a standalone script that `triton_workers.py` starts as a process.

`python triton_worker_main.py [TARGET [driver]] [--channels R:W,...]`, TARGET being the
parent's GPU as JSON (`["cuda", 90, 32]`: backend, architecture, warp size); `driver`: also
build Triton's CUDA driver module into the cache (a gcc run the parent's first use of Triton's
driver would make). A worker reads one JSON job per line and answers one line per job:
`{"kernel": ..., "ok": true, "hash": ..., "seconds": ...}` (`hash`: the key Triton's cache
files the kernel under, when it was compiled from a specialization) or
`{"kernel": ..., "ok": false, "error": "..."}`. Its first line, `{"ready": true, "at": ...,
"pid": ...}`, says when it can take jobs. It exits when its jobs end.

The process serves stdin and stdout itself, and forks one more worker per `R:W` pair of pipes
the parent passed (`--channels`), after paying Triton's once-a-process costs (importing it,
hashing its own library for cache keys, loading the backend, asking ptxas its version). So a
pool of 16 workers pays them once, not 16 times at once: without bytecode caches each worker
spent about a second of CPU compiling Triton's source, while the parent, on the same CPUs,
imports torch's tracing machinery and traces the graph. The first kernel, which the parent
waits for, does not pay them either.

A job names a kernel of a kernel-module file (`path`, `kernel`) and how the parent will launch
it, in one of two forms:

* `specialization`: the JSON Triton itself builds for a launch (argument types, constexprs,
  alignment attributes, options; the parent gets it from `JITFunction.warmup` without
  compiling, triton_builder.py). The worker compiles exactly that with `triton.compile` for
  TARGET — the cache key is the one the parent's first launch looks up — and builds the
  kernel's C launcher, which Triton would otherwise build in the parent at that launch (unless
  the job says `"launcher": false`: the parent launches it with kiln's native launch). This
  path never imports torch and never touches the GPU: the worker is ready in a fraction of a
  second (importing torch took 3-4 s a worker on the 16-CPU H200 host, with the 16 starting
  together, and each held a CUDA context).
* `dtypes`, `grid`, `constexprs`, `num_warps`: the fallback when the parent could not get a
  specialization; `JITFunction.warmup` compiles it for the current device, importing torch.

Why a script and not `multiprocessing`: a spawned multiprocessing child re-imports the parent's
`__main__`, so a user script without an `if __name__ == "__main__":` guard would run again in
every worker (model building, training, all of it). This file imports only Triton, the kernel
module and (for fallback jobs) torch; it never imports kiln or the user's code.
"""

import hashlib
import importlib.util
import json
import os
import sys
import time

_TARGET = None  # triton.backends.compiler.GPUTarget of the parent's device, or None


def _load(path: str):
    name = "kiln_triton_" + os.path.basename(path).split(".")[0][:24]
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # Triton resolves a kernel's globals through its module
        spec.loader.exec_module(module)
    return module


def _prepare(target_json: str | None) -> None:
    """Triton's once-a-process work, done before the first job arrives (and, in a pool, before
    the other workers are forked, so that it is done once for all of them)."""
    global _TARGET
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    if not target_json:
        return
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.cache import triton_key

    target = GPUTarget(*json.loads(target_json))
    make_backend(target).hash()  # loads the backend, runs `ptxas --version`
    triton_key()  # Triton's hash of its own files (libtriton is 415 MB, ~0.3 s), in every key
    import triton.compiler.code_generator  # noqa: F401

    _TARGET = target


def _build_driver() -> None:
    """Build Triton's CUDA driver module into its cache: a gcc run the parent's first use of
    the driver would make. In the parent, a large process, it also held up the main thread by
    up to a second (forking it); here it costs the parent nothing."""
    if _TARGET is None or _TARGET.backend != "cuda":
        return
    try:
        from triton.backends.nvidia.driver import CudaUtils

        CudaUtils()
    except Exception:  # the parent builds it at its first launch
        pass


def _unpack(data: dict, tl):
    """`JITFunction.preload`'s reading of a specialization, without a driver."""
    constexprs = {
        tuple(k): tl.dtype(v)
        if tl.dtype.is_dtype(v)
        else tl.constexpr(v["constexpr"])
        if isinstance(v, dict) and "constexpr" in v
        else v
        for k, v in zip(data["constant_keys"], data["constant_vals"])
    }
    attrs = dict(zip(map(tuple, data["attrs_keys"]), data["attrs_vals"]))
    signature = {k: tuple(v) if isinstance(v, list) else v for k, v in data["signature"].items()}
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in data["options"].items()}
    return signature, constexprs, attrs, options


def _compile_specialized(fn, specialization: str, launcher: bool = True) -> str:
    import triton
    import triton.language as tl
    from triton.compiler import ASTSource, make_backend

    data = json.loads(specialization)
    signature, constexprs, attrs, options = _unpack(data, tl)
    backend = make_backend(_TARGET)
    options = backend.parse_options(options)
    src = ASTSource(fn, signature, constexprs, attrs)
    ours = launcher and _TARGET.backend == "cuda" and _claim_launcher(signature)
    building = _build_launcher_meanwhile(src) if ours else None
    compiled = triton.compile(src, target=_TARGET, options=options.__dict__)
    if building is not None:
        building.join()
    if building is not None or not (launcher or plain_launch(compiled.metadata)):
        try:  # the C launcher the parent would compile at its first launch (a gcc run); a
            # cache hit when the one built meanwhile matches (no tensor descriptors)
            from triton.backends.nvidia.driver import CudaLauncher

            CudaLauncher(src, compiled.metadata)
        except Exception:  # the parent builds it then
            pass
    return compiled.hash


def plain_launch(metadata) -> bool:
    """Whether kiln's native launch can take a kernel with this metadata: one CTA per program,
    no cooperative or PDL launch, no scratch memory, no tensor descriptors. The parent reads
    it from here too (triton_native_launcher.py); this script itself never imports kiln. A
    worker told to skip the kernel's C launcher still builds it when this says no: the
    parent's first launch will need Triton's launcher after all."""
    return (
        getattr(metadata, "num_ctas", 1) == 1
        and not getattr(metadata, "launch_cooperative_grid", False)
        and not getattr(metadata, "launch_pdl", False)
        and not getattr(metadata, "global_scratch_size", 0)
        and not getattr(metadata, "profile_scratch_size", 0)
        and not getattr(metadata, "tensordesc_meta", None)
    )


def _claim_launcher(signature: dict) -> bool:
    """Whether this worker builds the C launcher of a kernel with `signature`: the first to
    claim it (a file created exclusively in the pool's folder, `KILN_LAUNCHER_CLAIMS`) does.
    Triton writes a launcher's C source from the argument types alone, so kernels with the
    same types share one (a training step of a six-layer GPT: 18 kernels, 10 launchers), and
    two workers building it at once would both run gcc. The parent waits for every job of a
    graph before its first launch, and a launcher that is missing then it builds itself."""
    key = hashlib.sha256(json.dumps(list(signature.values())).encode()).hexdigest()[:32]
    return _claim(key) is not False  # no pool folder: build it, as without one


def _claim(name: str) -> bool | None:
    """Claim `name` in the pool's folder (`KILN_LAUNCHER_CLAIMS`) by creating it exclusively:
    True when this worker is the first, False when another worker was, None when there is no
    pool folder to claim in."""
    folder = os.environ.get("KILN_LAUNCHER_CLAIMS")
    if not folder:
        return None
    try:
        os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except OSError:
        return None
    return True


class _NoScratch:
    """What `CudaLauncher` reads from a compiled kernel's metadata, for a kernel that is still
    being compiled: no tensor descriptors (kiln's kernels use none; the C source depends only
    on that and the signature), no scratch memory."""

    tensordesc_meta = None
    num_ctas = 1
    global_scratch_size = profile_scratch_size = 0
    global_scratch_align = profile_scratch_align = 1
    launch_cooperative_grid = launch_pdl = False


def _build_launcher_meanwhile(src):
    """Build the kernel's C launcher into Triton's cache in a thread, while this process compiles
    the kernel: the build is a gcc run (0.3-0.4 s on the H200 host, as long as or longer than
    compiling the kernel), which waits in a subprocess without holding the GIL. Gives the
    thread; a failure leaves the build to the usual call after the compile."""
    import threading

    def build():
        try:
            from triton.backends.nvidia.driver import CudaLauncher

            CudaLauncher(src, _NoScratch)
        except Exception:
            pass

    thread = threading.Thread(target=build, daemon=True)
    thread.start()
    return thread


def _compile_warmup(fn, job: dict) -> None:
    import torch

    dtypes = [d if isinstance(d, int) else getattr(torch, d) for d in job["dtypes"]]
    fn.warmup(*dtypes, grid=tuple(job["grid"]), num_warps=job["num_warps"], **job["constexprs"])


def _compile(job: dict) -> str | None:
    """Compile a job; gives the kernel's Triton cache hash when it was compiled from a
    specialization (the parent loads it by that hash, triton_builder.preload)."""
    fn = getattr(_load(job["path"]), job["kernel"])
    if job.get("specialization") and _TARGET is not None:
        return _compile_specialized(fn, job["specialization"], job.get("launcher", True))
    _compile_warmup(fn, job)
    return None


def _serve(jobs, replies) -> None:
    """Say ready, then answer each job read from `jobs` on `replies`, until `jobs` ends."""
    replies.write(json.dumps({"ready": True, "at": time.time(), "pid": os.getpid()}) + "\n")
    replies.flush()
    for line in jobs:
        if not line.strip():
            continue
        job = json.loads(line)
        start = time.perf_counter()
        try:
            reply = {"kernel": job["kernel"], "ok": True, "hash": _compile(job)}
        except Exception as e:  # reported to the parent, which compiles the kernel itself
            reply = {"kernel": job["kernel"], "ok": False, "error": f"{type(e).__name__}: {e}"}
        reply["seconds"] = time.perf_counter() - start
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def _channels(spec: str | None) -> list[tuple]:
    """The (jobs, replies) pairs: stdin and a copy of stdout, then one pair of pipes per `R:W`
    of `spec` (file descriptors the parent passed). Stdout itself then goes to /dev/null, so
    that nothing a kernel module or Triton prints can break a reply line."""
    pairs = [(sys.stdin, os.fdopen(os.dup(1), "w"))]
    _to_devnull(1)
    for pair in spec.split(",") if spec else ():
        r, w = (int(fd) for fd in pair.split(":"))
        pairs.append((os.fdopen(r), os.fdopen(w, "w")))
    return pairs


def _to_devnull(*fds: int) -> None:
    """Point `fds` at /dev/null. Not closed: a descriptor opened later would take their number
    (0 or 1) and with it whatever is written there."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        os.dup2(devnull, fd)
    os.close(devnull)


def _fork_workers(channels: list[tuple]) -> tuple[int, list[int]]:
    """One forked worker per channel after the first: gives the index of the channel this
    process serves and, in the first process, its children's pids. Each process lets go of the
    other channels, so that a worker that dies shows as the end of its own replies only."""
    children = []
    for k in range(1, len(channels)):
        pid = os.fork()
        if pid == 0:
            children, mine = [], k
            break
        children.append(pid)
    else:
        mine = 0
    for k, (jobs, replies) in enumerate(channels):
        if k == mine:
            continue
        if k == 0:  # stdin
            _to_devnull(0)
        else:
            jobs.close()
        replies.close()
    return mine, children


def main(argv: list[str]) -> int:
    spec = None
    if "--channels" in argv:
        at = argv.index("--channels")
        spec, argv = argv[at + 1], argv[:at] + argv[at + 2 :]
    try:
        _prepare(argv[1] if len(argv) > 1 else None)
    except Exception:  # jobs with a specialization then fall back to warmup
        pass
    channels = _channels(spec)
    mine, children = _fork_workers(channels)
    if mine:
        try:
            _serve(*channels[mine])
        finally:
            os._exit(0)  # a forked worker: none of the first process's exit handlers
    if argv[2:3] == ["driver"]:
        _build_driver()
    _serve(*channels[0])
    for pid in children:  # they end when the parent closes their jobs, as it does all at once
        os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
