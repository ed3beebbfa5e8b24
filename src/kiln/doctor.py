"""`kiln doctor`: what this installation of kiln will do, and why, in a few lines.

Takes nothing (reads the environment through options.py); prints the versions kiln's caches
are keyed by, the C++ compiler the CPU code generator uses, where the caches live, whether
Triton and a GPU are there, and which path the native guard checks take in a process started
now (loaded, not built yet, off, or failed, with the reason). It starts no build: asking must
not cost the 15 s that `kiln native` spends on purpose.
"""

from __future__ import annotations

import platform
import sys


def lines() -> list[str]:
    import torch

    from . import native, options

    out = [
        f"kiln: python {platform.python_version()}, torch {torch.__version__}, "
        f"{platform.system()} {platform.machine()}"
    ]
    try:
        from .runtime.cpp_builder import find_compiler

        path, version = find_compiler()
        out.append(f"C++ compiler: {path} ({version})")
    except Exception as e:  # CompilerNotFound: say what the CPU code generator will do
        out.append(f"C++ compiler: none, so CPU graphs run eagerly: {e}")
    out.append(f"kernel cache: {options.env_cache_dir()}")
    enabled, folder = options.env_native()
    out.append(f"native checks folder: {folder}" + ("" if enabled else " (KILN_NATIVE=0)"))
    out.append(f"native checks: {native.describe(native.probe())}")
    try:
        import triton

        out.append(f"triton: {triton.__version__}")
    except Exception as e:
        out.append(f"triton: not importable ({type(e).__name__}), so GPU graphs run eagerly")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    out.append(f"GPU: {gpu}")
    return out


def main(argv: list[str]) -> int:
    if argv:
        print("usage: kiln doctor", file=sys.stderr)
        return 2
    print("\n".join(lines()))
    return 0
