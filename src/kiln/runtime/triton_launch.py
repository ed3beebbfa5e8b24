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

Where kiln's native launcher took the kernel and its arguments are tensors only, the first
launch also binds it (`bind_launch`, native_launch.cpp): `FastKernel` is a dict from grid to
launch, and the grid's entry becomes the native `BoundLaunch`, so the wrapper's
`kernel0[grid](...)` is a dict lookup and one C call that reads the addresses and the stream
and launches, with no Python frame (ResNet-50: 50 launches a call at 7.6 us each through
`_Launch.__call__` before). It hands every case it does not take to the `_Launch` below.

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

from functools import reduce
from operator import or_

import torch

from .. import native
from .triton_native_launcher import NativeLauncher, native_launchers

_data_ptr = torch.Tensor.data_ptr
_stream_of = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent in CPU builds


def _int_class(a: int) -> tuple:
    """What Triton specializes an integer argument (a size argument) on: equal to 1 (then a
    constant of the kernel), divisible by 16, past 32 bits."""
    return (a == 1, a % 16 == 0, not -(2**31) <= a < 2**31)


def _aligned(args) -> tuple:
    """What Triton specializes a launch on: pointers 16-byte aligned, integer arguments (kiln's
    size arguments) as `_int_class` says. Launches that agree here run the same compiled
    kernel, whatever the sizes."""
    return tuple(
        a.data_ptr() % 16 == 0
        if isinstance(a, torch.Tensor)
        else _int_class(a)
        if type(a) is int
        else a
        for a in args
    )


class _Launch:
    __slots__ = (
        "jit", "grid", "compiled", "aligned", "consts", "device", "raw", "head", "owner", "key",
        "ints", "int_classes", "tensors",
    )  # fmt: skip

    def __init__(self, jit, grid: tuple, owner: dict | None = None) -> None:
        self.jit, self.grid = jit, tuple(grid) + (1,) * (3 - len(grid))
        self.compiled = self.raw = None
        self.ints: tuple = ()  # positions of integer (size) arguments, for a raw launch
        self.owner, self.key = owner, grid  # the FastKernel holding this launch, under `key`

    def __call__(self, *args, **kwargs):
        raw = self.raw
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
        with native_launchers():  # a kernel first launched here gets kiln's launcher
            kernel = self.jit[self.grid](*args, **kwargs)
        if ck is None and kernel is not None and hasattr(kernel, "packed_metadata"):
            self._keep(kernel, args, kwargs)

    def _raw_args(self, args) -> list | None:
        """The launcher's arguments (pointers as addresses, sizes as they are) when this launch
        matches the compiled specialization: every pointer 16-byte aligned and every size of
        the class it was compiled for (a size of 1 is a constant of the kernel, so a launch
        with another value must not reuse it); else None (Triton's path picks the variant)."""
        vals = [a if type(a) is int else _data_ptr(a) for a in args]
        if reduce(or_, [vals[i] for i in self.tensors], 0) & 15:
            return None
        for i, cls in zip(self.ints, self.int_classes):
            if _int_class(vals[i]) != cls:
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
                if not ints:
                    self._bind(kernel, launcher, len(args))

    def _bind(self, kernel, launcher, nparams: int) -> None:
        """Put a native `BoundLaunch` in the owner's place of this launch, where kiln's native
        launcher took the kernel and its parameters are `nparams` pointers followed by
        constexprs (what the bound launch packs)."""
        # (kiln's native launcher takes only single-CTA kernels: triton_native_launcher)
        if self.owner is None or not isinstance(launcher, NativeLauncher):
            return
        if launcher.codes.rstrip(b"c") != b"p" * nparams:
            return
        num_warps, _, shared = kernel.packed_metadata
        bind = getattr(native.start(), "bind_launch", None)
        if bind is None:  # the native module is not loaded
            return
        from triton import knobs

        g = self.grid
        bound = bind(self, kernel.function, g[0], g[1], g[2], num_warps, shared, nparams,
                     self.device, _data_ptr, _stream_of, knobs.runtime)  # fmt: skip
        self.owner[self.key] = bound
        # the bound launch holds this one and is not seen by the garbage collector, so this
        # one keeps no reference back to it (through the owner or otherwise): no cycle
        self.owner = None


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
    made from it (which falls back to the `_Launch` for what it does not take)."""

    def __init__(self, jit) -> None:
        super().__init__()
        self.jit = jit
        self._launches: dict[tuple, _Launch] = {}

    def __missing__(self, grid) -> _Launch:
        launch = self._launches[grid] = self[grid] = _Launch(self.jit, grid, self)
        return launch

    def __getattr__(self, name):
        return getattr(self.jit, name)
