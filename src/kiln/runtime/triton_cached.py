"""Kernels loaded from Triton's cache as they are: a warm process's launches with no `JITFunction`.

Takes a kernel module's source, its launch plans (`launches`, as the Triton builder gets them)
and what the compile workers recorded for its kernels in an earlier process (triton_builder.py
`_built_hashes`, `record_of` here: per kernel, its Triton cache hash, the digest of the launch
plan it was compiled for and its specialization); gives a stand-in for the imported module
whose kernels are `CachedKernel`s: each wraps the `CompiledKernel` read from Triton's cache
under its hash, launched by kiln's native launch (triton_native_launcher.py).

Why: importing the kernel module builds a `JITFunction` per kernel (Triton reads each one's
source with `inspect` and parses it), and finding which compiled variant a launch needs goes
through Triton's binder, whose first call imports `triton.experimental` (Gluon): together a
third of a GPT-2 warm start's first call on the H200 host. kiln knows the answer already: the
variant each kernel was compiled for is the one its launch plan asked for, and the record says
where Triton keeps it.

A `CachedKernel` checks, at each grid's first launch, that the launch is the one its plan
described (argument dtypes, integer arguments of the same specialization classes, pointers
16-byte aligned, the same constexprs and warps); a launch that is not, and any use other than
a launch (`kernel.src`, `kernel.fn`, a launch while Triton's launch hooks are set), imports the
module and goes through Triton's `JITFunction` as before. A module whose record is incomplete
(a kernel compiled in the parent, an older record, a binary gone from Triton's cache), whose
kernels kiln's native launch cannot take, or any error while loading: None, and the builder
imports the module as before.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Callable

import torch

from .triton_worker_main import plain_launch

_ALIAS = re.compile(r"^(\w+) = (\w+)\b", re.M)  # `kernel3 = kernel1` (the same code)
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def int_class(a: int) -> int:
    """What Triton 3.6 specializes an integer argument (a size argument) on (`specialize_impl`
    of runtime/jit.py): bit 0 equal to 1 (then a constexpr of the kernel, not a parameter),
    bit 1 divisible by 16, bits 2-3 the type it is passed as (0 i32, 1 i64, 2 u64, 3 none:
    past 64 bits). native_launch.cpp's `int_class` computes the same for bound launches."""
    if -(2**31) <= a < 2**31:
        width = 0
    elif -(2**63) <= a < 2**63:
        width = 1
    else:
        width = 2 if 0 <= a < 2**64 else 3
    return (a == 1) | (a % 16 == 0) << 1 | width << 2


def plan_digest(plan: Any) -> str:
    """A digest of a kernel's launch plan (argument dtypes or integer values, constexprs,
    warps): what its compiled variant depends on (the grid does not)."""
    dts, _grid, consts, warps = plan
    text = repr(([str(d) for d in dts], sorted(consts.items()), warps))
    return hashlib.sha256(text.encode()).hexdigest()


def record_of(spec: str, kernel_hash: str, plan: Any) -> list:
    """What is recorded of a kernel a worker compiled (triton_builder._remember_hashes): the
    digest of its specialization, its hash, its plan's digest and the specialization (Triton's
    JSON: argument types, constexprs, options)."""
    return [hashlib.sha256(spec.encode()).hexdigest(), kernel_hash, plan_digest(plan), spec]


def load(source: str, launches: dict, known: dict, import_module: Callable[[], Any]) -> Any:
    """The module's stand-in (see the module doc), or None. `import_module()` imports the real
    module (for a launch the record does not vouch for)."""
    if not launches or any(len(known.get(name, ())) < 4 for name in launches):
        return None
    for name in launches:
        if known[name][2] != plan_digest(launches[name]):
            return None
    from . import triton_native_launcher

    launch = triton_native_launcher._native_launch()
    if launch is None:  # Triton's own launcher needs the real source object
        return None
    try:
        import json

        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.cache import get_cache_manager

        kernels = {}
        for name, plan in launches.items():
            kernel_hash, signature = known[name][1], json.loads(known[name][3])["signature"]
            group = get_cache_manager(kernel_hash).get_group(f"{name}.json")
            if not group or f"{name}.json" not in group or f"{name}.cubin" not in group:
                return None
            # the metadata and the binary: the IR texts beside them (PTX, LLVM IR, ...) are
            # for reading, and Triton's cache hit reads them all
            group = {k: v for k, v in group.items() if k.endswith((".json", ".cubin"))}
            compiled = CompiledKernel(_Source(name, signature), group, kernel_hash)
            codes = triton_native_launcher.codes(signature)
            if codes is None or len(codes) > triton_native_launcher.MAX_PARAMS:
                return None
            if not plain_launch(compiled.metadata):
                return None
            kernels[name] = CachedKernel(name, compiled, plan)
    except Exception:  # noqa: BLE001 - anything unexpected: the module is imported as before
        return None
    aliases = {a: b for a, b in _ALIAS.findall(source) if b in kernels and a not in kernels}
    return CachedModule(kernels, aliases, import_module)


class _Source:
    """What Triton's `CompiledKernel` and kiln's native launcher read of a kernel's source
    object (`ASTSource` otherwise): its name and argument types."""

    def __init__(self, name: str, signature: dict) -> None:
        self.name = name
        self.signature = {k: tuple(v) if isinstance(v, list) else v for k, v in signature.items()}
        self.fn = None


class CachedModule:
    """An imported kernel module's stand-in: `CachedKernel`s by name; any other name (a looped
    twin the plans leave out: launched only for rows longer than the sizes first seen) a
    `Deferred` one, which imports the module (once) when it is first used."""

    def __init__(self, kernels: dict, aliases: dict, import_module: Callable[[], Any]) -> None:
        self._kernels = kernels
        self._aliases = aliases
        self._import = import_module
        self._module: Any = None
        for k in kernels.values():
            k.module = self
        self.__name__ = f"kiln_triton_cached_{id(self):x}"

    def real(self) -> Any:
        if self._module is None:
            self._module = self._import()
        return self._module

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        kernels = self.__dict__["_kernels"]
        found = kernels.get(name) or kernels.get(self.__dict__["_aliases"].get(name))
        return found if found is not None else Deferred(self, name)


class Deferred:
    """An attribute of the real kernel module, looked up when first used."""

    def __init__(self, module: CachedModule, name: str) -> None:
        self._module, self._name = module, name

    def __getitem__(self, grid: Any) -> Any:
        return getattr(self._module.real(), self._name)[grid]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_module", "_name"):
            raise AttributeError(name)
        return getattr(getattr(self._module.real(), self._name), name)


class CachedKernel:
    """A kernel as Triton's cache holds it, for the launch plan it was compiled for; anything
    else it is asked goes to the module's `JITFunction` (imported then)."""

    def __init__(self, name: str, compiled: Any, plan: Any) -> None:
        self.name = name
        self.compiled = compiled
        dts, _grid, consts, warps = plan
        self.dtypes = list(dts)
        self.consts = dict(consts)
        self.warps = warps
        self.module: Any = None

    def serves(self, args: tuple, kwargs: dict) -> bool:
        """Whether a launch with these arguments runs the compiled variant: each tensor of
        the planned dtype at a 16-byte aligned address, each integer of its planned value's
        classes (1, divisible by 16, 64-bit), the planned constexprs and warps."""
        if len(args) != len(self.dtypes):
            return False
        for a, want in zip(args, self.dtypes):
            if isinstance(a, torch.Tensor):
                if isinstance(want, int) or a.dtype != want or a.data_ptr() % 16:
                    return False
            elif type(a) is int:
                if type(want) is not int or int_class(a) != int_class(want):
                    return False
            else:
                return False
        consts = {k: v for k, v in kwargs.items() if k not in _OPTIONS}
        other = {k for k in kwargs if k in _OPTIONS and k != "num_warps"}
        return consts == self.consts and not other and kwargs.get("num_warps", 4) == self.warps

    def jit(self) -> Any:
        """The module's `JITFunction` of this kernel (the module imported on first use)."""
        return getattr(self.module.real(), self.name)

    def __getitem__(self, grid: Any) -> Any:
        return self.jit()[grid]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("compiled", "module", "dtypes", "consts", "warps"):
            raise AttributeError(name)
        return getattr(self.jit(), name)
