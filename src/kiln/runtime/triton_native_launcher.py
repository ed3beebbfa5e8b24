"""Triton kernels launched through kiln's generic native launch: no C build per signature.

Takes a compiled kernel's source and metadata, as Triton's `CudaLauncher` does; gives an object
with the same interface (`launch`, `__call__`, the scratch sizes, the cooperative and PDL
flags), whose `launch` is `native_launch.cpp`'s one C function bound to a string of argument
codes. Triton writes a C launcher per argument signature and builds it with gcc (0.3-0.4 s a
build on the H200 host). A worker that builds one takes that long for a kernel that compiles
in 0.1-0.2 s, and a six-layer GPT's training step has ten signatures: those builds were the
longest part of its parallel compile. With the native module loaded (native.py, built once
per machine), kiln's kernels need none of them.

`native_launchers()` is the context in which Triton gives a kiln kernel its launcher (its first
launch: `CompiledKernel._init_handles` reads `driver.active.launcher_cls`): inside it, a kernel
this launch can take gets `NativeLauncher`, any other (tensor descriptors, clusters,
cooperative or PDL launches, scratch memory, tuple arguments) Triton's own `CudaLauncher`.
`available()` says whether kiln's launches go this way: the native module is loaded and
Triton is a version whose kernel parameters are laid out as `native_launch.cpp` expects (3.6:
the arguments that are not constexpr, then the global and profile scratch pointers). The
compile workers skip Triton's launcher builds when it does (triton_builder.warm).
"""

from __future__ import annotations

import contextlib
import functools

from .triton_worker_main import plain_launch

# Triton's argument types -> native_launch.cpp's codes
_CODES = {
    "i1": "b",
    "i8": "b",
    "i16": "h",
    "i32": "i",
    "i64": "l",
    "u1": "B",
    "u8": "B",
    "u16": "H",
    "u32": "I",
    "u64": "L",
    "fp16": "e",
    "bf16": "a",
    "fp32": "f",
    "f32": "f",
    "fp64": "d",
    "constexpr": "c",
}
MAX_PARAMS = 512  # native_launch.cpp's kMaxParams: a kernel with more keeps Triton's launcher
_TRITON_VERSIONS = ("3.6.",)  # kernel parameter layouts native_launch.cpp was checked against


def codes(signature: dict) -> bytes | None:
    """The argument codes of a kernel signature ({name: Triton type}), or None when one type
    is not a plain pointer, scalar or constexpr (a tuple, a tensor descriptor)."""
    out = []
    for ty in signature.values():
        if not isinstance(ty, str):
            return None
        if ty.startswith("*"):
            out.append("p")
        elif ty in _CODES:
            out.append(_CODES[ty])
        else:
            return None
    return "".join(out).encode()


class NativeLauncher:
    """`CudaLauncher`'s interface over the native launch (see module doc)."""

    num_ctas = 1
    global_scratch_size = profile_scratch_size = 0
    global_scratch_align = profile_scratch_align = 1
    launch_cooperative_grid = launch_pdl = False

    def __init__(self, launch, codes: bytes) -> None:
        self.launch = launch
        self.codes = codes  # the argument codes `launch` is bound to

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.launch(gridX, gridY, gridZ, stream, function, False, False, None, None, *args)


@functools.lru_cache(maxsize=None)
def triton_version_known() -> bool:
    """The GPU is NVIDIA's (native_launch.cpp calls the CUDA driver) and Triton is a version
    whose kernel parameters native_launch.cpp lays out (`_TRITON_VERSIONS`)."""
    import torch

    if torch.version.hip is not None:
        return False
    try:
        import triton
    except ImportError:
        return False
    return triton.__version__.startswith(_TRITON_VERSIONS)


def _native_launch():
    """The native module's `launch`, when it is loaded and `triton_version_known()`."""
    if not triton_version_known():
        return None
    from .. import native

    module = native.start()
    return getattr(module, "launch", None)


def available() -> bool:
    return _native_launch() is not None


def launcher_class(launch, fallback):
    """A `launcher_cls` for Triton: `NativeLauncher` where the kernel allows, else `fallback`."""

    def make(src, metadata):
        signature = getattr(src, "signature", None)  # None: a source kind not known here
        sig = codes(signature) if signature is not None and plain_launch(metadata) else None
        if sig is None or len(sig) > MAX_PARAMS:  # an optimizer step's one-row kernel: 593
            return fallback(src, metadata)
        return NativeLauncher(functools.partial(launch, sig), sig)

    return make


@contextlib.contextmanager
def native_launchers():
    """Kernels that Triton first launches (and so gives a launcher) in this context get
    `NativeLauncher` where they can (see module doc); nothing changes when it is not
    available."""
    launch = _native_launch()
    if launch is None:
        yield
        return
    from triton.runtime import driver

    active = driver.active
    previous = active.launcher_cls
    active.launcher_cls = launcher_class(launch, previous)
    try:
        yield
    finally:
        active.launcher_cls = previous
