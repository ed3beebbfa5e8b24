"""Fast Triton launches: call a compiled kernel's C launcher directly after its first launch.

Takes a `@triton.jit` function; gives an object used exactly like it in the wrapper program —
`kernel0[grid](buf0, arg0, XBLOCK=1024, num_warps=4)` — that launches with a fraction of the
Python overhead. `JITFunction.run` binds arguments, computes a specialization key and looks up
its cache on every launch (tens of microseconds); a graph of small kernels (a decode step: a
hundred launches) spends more time there than on the GPU. Here the first launch of each grid
goes through Triton as usual and keeps the `CompiledKernel` it returns; later launches call
its C launcher (`CudaLauncher.launch`) with the current stream and the arguments' data
pointers as integers. Given a tensor, that launcher calls `data_ptr()` itself and asks the
driver what kind of pointer it is (`cuPointerGetAttribute`, about a microsecond per argument
on the H200 host); the pointers are read here anyway, to check alignment, so each is read
once. The wrapper program has already checked that every tensor is on the kernel's device.
A kernel that needs scratch memory, or a Triton without these entry points, launches through
`CompiledKernel.run` (the launcher's Python half, which allocates the scratch). The launcher
itself is kiln's generic native one where it can be (triton_native_launcher.py): Triton gives
a kernel its launcher at the first launch, which happens here.

Where the kernel's parameters are tensors and integer (size) arguments and its launch is a
plain one (Triton 3.6's layout, one CTA, no scratch: what kiln's native launch takes), the first
launch also binds it (`bind_launch`, native_launch.cpp): `FastKernel` is a dict from grid to
launch, and the grid's entry becomes the native `BoundLaunch`, so the wrapper's
`kernel0[grid](...)` is a dict lookup and one C call that reads the addresses, packs the sizes
by the kernel's argument codes (`bound_codes`), checks their classes, reads the stream and
launches, with no Python frame (ResNet-50: 50 launches a call at 7.6 us each through
`_Launch.__call__` before; GPT-2 served at any length: 52 launches a call through
`_raw_args`, ~10 us each). It hands every case it does not take to the `_Launch` below. A
kernel first launched while the native module was still being built (a fresh machine's first
minute) is bound on a later launch, once the module has loaded. A grid whose sizes change
specialization class (below) binds each class's variant in front of the ones before, up to
`_VARIANTS`: a reduction over a growing length launches natively whether it is divisible by
16 or not.

A compiled kernel is specialized on which pointer arguments are 16-byte aligned, and on which
integer arguments (the size arguments of a kernel compiled for symbolic sizes) are 1 or
divisible by 16; a later launch whose arguments differ there (a view at an odd offset, a length
not divisible by 16) takes Triton's own path, which picks or compiles the matching variant. A
kernel with size arguments launches raw too, its sizes' classes checked on each launch (GPT-2
served at any length: 51 launches a call through `CompiledKernel.run` cost its dynamic entry
1.8 ms more host time per call than a static entry's, on the H200 host). While a
launch hook is set (profilers add them to `knobs.runtime.launch_enter_hook`), launches take
Triton's path, so the hooks see every launch.
"""

from __future__ import annotations

import weakref
from functools import reduce
from operator import or_

import torch

from .. import native
from .triton_cached import CachedKernel, int_class
from .triton_native_launcher import (
    MAX_PARAMS,
    NativeLauncher,
    native_launchers,
    triton_version_known,
)
from .triton_native_launcher import codes as signature_codes
from .triton_worker_main import plain_launch

_data_ptr = torch.Tensor.data_ptr
_stream_of = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent in CPU builds


_INT_CODES = frozenset(b"cbBhHiIlL")  # native_launch.cpp's integer codes ('c': the constant 1)


def bound_codes(signature: bytes | None, args) -> tuple[bytes, bytes] | None:
    """What a native bound launch of a kernel first launched with positional `args` takes:
    per argument its code (from the kernel's `signature` codes, triton_native_launcher) and
    the class it was compiled for (`int_class` of an integer; 0 for a tensor). None when a
    bound launch cannot take the kernel: an argument neither a tensor nor an int, a code that
    does not fit its argument (a positional constexpr other than a size equal to 1), or a
    parameter after them that is not a constexpr (passed by keyword, which the bound launch
    does not pack)."""
    n = len(args)
    if signature is None or len(signature) < n or signature[n:].strip(b"c"):
        return None
    classes = bytearray()
    for a, code in zip(args, signature):
        if isinstance(a, torch.Tensor):
            if code != ord("p"):
                return None
            classes.append(0)
        elif type(a) is int:
            cls = int_class(a)
            if code not in _INT_CODES or cls > 11 or (code == ord("c") and a != 1):
                return None
            classes.append(cls)
        else:
            return None
    return signature[:n], bytes(classes)


def _aligned(args) -> tuple:
    """What Triton specializes a launch on: pointers 16-byte aligned, integer arguments (kiln's
    size arguments) as `int_class` says. Launches that agree here run the same compiled
    kernel, whatever the sizes."""
    return tuple(
        a.data_ptr() % 16 == 0
        if isinstance(a, torch.Tensor)
        else int_class(a)
        if type(a) is int
        else a
        for a in args
    )


class _Launch:
    __slots__ = (
        "jit", "grid", "compiled", "aligned", "consts", "device", "raw", "head", "owner", "key",
        "ints", "int_classes", "tensors", "pending", "bound",
    )  # fmt: skip

    def __init__(self, jit, grid: tuple, owner: dict | None = None) -> None:
        self.jit, self.grid = jit, tuple(grid) + (1,) * (3 - len(grid))
        self.compiled = self.raw = None
        self.ints: tuple = ()  # positions of integer (size) arguments, for a raw launch
        # the FastKernel holding this launch under `key`, weakly: the bound launches put in
        # its place hold this one and are not seen by the garbage collector (no cycles)
        self.owner = weakref.ref(owner) if owner is not None else None
        self.key = grid
        self.pending: tuple | None = None  # (kernel, bound_codes), to bind once native loads
        self.bound: set = set()  # the specializations (`_aligned`) bound for this grid

    def __call__(self, *args, **kwargs):
        raw = self.raw
        if self.pending is not None:
            self._bind_when_loaded()
        if raw is not None and _no_hooks():
            if self.ints:
                vals = self._raw_args(args)
                if vals is not None:
                    g0, g1, g2, function, coop, pdl, meta = self.head
                    raw(g0, g1, g2, _stream_of(self.device), function, coop, pdl, None, None,
                        meta, None, None, None, *vals, *self.consts)  # fmt: skip
                    return
            else:
                ptrs = tuple(map(_data_ptr, args))
                if not reduce(or_, ptrs, 0) & 15:  # every pointer 16-byte aligned, as compiled
                    g0, g1, g2, function, coop, pdl, meta = self.head
                    raw(g0, g1, g2, _stream_of(self.device), function, coop, pdl, None, None,
                        meta, None, None, None, *ptrs, *self.consts)  # fmt: skip
                    return
        ck = self.compiled
        if ck is not None and _no_hooks() and _aligned(args) == self.aligned:
            g = self.grid
            ck.run(g[0], g[1], g[2], _stream_of(self.device), ck.function, ck.packed_metadata,
                   None, None, None, *args, *self.consts)  # fmt: skip
            return
        jit = self.jit
        if ck is None and isinstance(jit, CachedKernel) and jit.serves(args, kwargs):
            if _no_hooks():  # (hooks see launches through Triton's JITFunction)
                self._first_cached(jit.compiled, args, kwargs)
                return
        with native_launchers():  # a kernel first launched here gets kiln's launcher
            kernel = self.jit[self.grid](*args, **kwargs)
        if kernel is None or not hasattr(kernel, "packed_metadata"):
            return
        if ck is None:
            self._keep(kernel, args, kwargs)
        elif self.bound and _no_hooks():  # a size of another class: Triton gave its variant
            self._bind_variant(kernel, args)

    def _first_cached(self, kernel, args, kwargs) -> None:
        """The first launch of a kernel loaded from Triton's cache (triton_cached.py), for the
        launch it was compiled for: its launcher is kiln's native one (the loader checked that
        it can be), then it is kept as a kernel Triton launched is."""
        with native_launchers():
            kernel.run  # noqa: B018 - loads the binary and makes the launcher, in this context
        self._keep(kernel, args, kwargs)
        g = self.grid
        kernel.run(g[0], g[1], g[2], _stream_of(self.device), kernel.function,
                   kernel.packed_metadata, None, None, None, *args, *self.consts)  # fmt: skip

    def _raw_args(self, args) -> list | None:
        """The launcher's arguments (pointers as addresses, sizes as they are) when this launch
        matches the compiled specialization: every pointer 16-byte aligned and every size of
        the class it was compiled for (a size of 1 is a constant of the kernel, so a launch
        with another value must not reuse it); else None (Triton's path picks the variant)."""
        vals = [a if type(a) is int else _data_ptr(a) for a in args]
        if reduce(or_, [vals[i] for i in self.tensors], 0) & 15:
            return None
        for i, cls in zip(self.ints, self.int_classes):
            if int_class(vals[i]) != cls:
                return None
        return vals

    def _keep(self, kernel, args, kwargs) -> None:
        """After the first launch: what later launches need to skip Triton's Python."""
        self.aligned = _aligned(args)
        self.consts = tuple(v for k, v in kwargs.items() if k not in _OPTIONS)
        self.device = torch.cuda.current_device()
        launcher = kernel.run  # loads the launcher now, not inside a later capture
        self.compiled = kernel
        # every argument a tensor at a 16-byte aligned address (the common case), or such
        # tensors and integer size arguments (a kernel compiled for symbolic sizes): launched
        # raw, the sizes' specialization classes checked on each launch (_raw_args)
        ints = tuple(i for i, a in enumerate(args) if type(a) is int)
        tensors = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        plain = len(ints) + len(tensors) == len(args) and all(self.aligned[i] for i in tensors)
        scratch = getattr(launcher, "global_scratch_size", 1) or getattr(
            launcher, "profile_scratch_size", 1
        )
        raw = getattr(launcher, "launch", None)
        if plain and not scratch and raw is not None:
            coop = getattr(launcher, "launch_cooperative_grid", None)
            pdl = getattr(launcher, "launch_pdl", None)
            if coop is not None and pdl is not None:
                g = self.grid
                self.head = (g[0], g[1], g[2], kernel.function, coop, pdl, kernel.packed_metadata)
                self.raw = raw
                self.ints, self.tensors = ints, tensors
                self.int_classes = tuple(self.aligned[i] for i in ints)
                codes = bound_codes(_signature_codes(kernel, launcher), args)
                if self.owner is not None and codes is not None:
                    self.pending = (kernel, codes)
                    self._bind_when_loaded()

    def _bind_when_loaded(self) -> None:
        """Bind `self.pending` now if the native module is loaded; while it is being built, a
        later launch tries again; where it will not load, never."""
        module = native.start()
        if module is None:
            if native.status()[0] not in ("idle", "building"):
                self.pending = None
            return
        kernel, (codes, classes) = self.pending
        self.pending = None
        self._bind(module, kernel, codes, classes, self.aligned)

    def _bind_variant(self, kernel, args) -> None:
        """Another specialization of this grid's kernel (a size divisible by 16 where the first
        was not, a size of 1, ...), which Triton's path just compiled or found: bound too, so
        that a grid whose sizes change class (a reduction over a growing length) launches
        natively in each class, up to `_VARIANTS` of them."""
        key = _aligned(args)
        if key in self.bound or len(self.bound) >= _VARIANTS:
            return
        if not all(a.data_ptr() % 16 == 0 for a in args if isinstance(a, torch.Tensor)):
            return  # a misaligned view: a bound launch takes only aligned addresses
        codes = bound_codes(_signature_codes(kernel, kernel.run), args)
        module = native.start()
        if codes is not None and module is not None:
            self._bind(module, kernel, codes[0], codes[1], key)

    def _bind(self, module, kernel, codes: bytes, classes: bytes, key: tuple) -> None:
        """Put a native `BoundLaunch` of `kernel` (its arguments' codes and classes as
        `bound_codes` gives them) in the owner's place of this launch; what it does not take
        goes to what held that place before (this launch, or the bound launch of another
        variant)."""
        owner = self.owner() if self.owner is not None else None
        bind = getattr(module, "bind_launch", None)
        if owner is None or bind is None:
            return
        from triton import knobs

        g = self.grid
        num_warps, _, shared = kernel.packed_metadata
        before = dict.get(owner, self.key, self)
        bound = bind(before, kernel.function, g[0], g[1], g[2], num_warps, shared, codes,
                     classes, self.device, _data_ptr, _stream_of, knobs.runtime)  # fmt: skip
        owner[self.key] = bound
        self.bound.add(key)


_VARIANTS = 4  # bound specializations per grid: the classes a size argument takes in practice


def _signature_codes(kernel, launcher) -> bytes | None:
    """The argument codes of a kernel whose parameters native_launch.cpp lays out as Triton
    does: one kiln's native launcher took (it carries them), or, where Triton's launcher took
    it because the native module was not loaded yet, a plain launch of a Triton version kiln
    knows (`triton_native_launcher`'s checks). None: a launch the bound one cannot make."""
    if isinstance(launcher, NativeLauncher):
        return launcher.codes
    src, metadata = getattr(kernel, "src", None), getattr(kernel, "metadata", None)
    signature = getattr(src, "signature", None)
    if signature is None or metadata is None or not plain_launch(metadata):
        return None
    if not triton_version_known():
        return None
    sig = signature_codes(signature)
    return sig if sig is not None and len(sig) <= MAX_PARAMS else None


_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _no_hooks() -> bool:
    """No launch hook is set (Triton keeps them as `HookChain`s, empty unless a profiler or
    debugger added one)."""
    runtime = _RUNTIME[0]
    if runtime is None:  # imported on the first launch, not per launch
        from triton import knobs

        runtime = _RUNTIME[0] = knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return not getattr(enter, "calls", enter) and not getattr(leave, "calls", leave)


_RUNTIME: list = [None]  # triton.knobs.runtime


class FastKernel(dict):
    """A `@triton.jit` function with cached launches, one per grid (see module doc): a dict from
    grid to launch, so that the wrapper's `kernel0[(25088,)]` is a dict lookup. A grid's entry
    is its `_Launch` until the first launch, then, where it can be, the native `BoundLaunch`
    made from it (which falls back to the `_Launch` for what it does not take), or the last of
    a chain of them, one per specialization."""

    def __init__(self, jit) -> None:
        super().__init__()
        self.jit = jit
        self._launches: dict[tuple, _Launch] = {}

    def __missing__(self, grid) -> _Launch:
        launch = self._launches[grid] = self[grid] = _Launch(self.jit, grid, self)
        return launch

    def __getattr__(self, name):
        return getattr(self.jit, name)
