"""The system C++ compiler: which one kiln builds with (the native module, the CPU kernels).

Takes nothing; gives `find_compiler()` -> (path, version line), cached for the process, or
`CompilerNotFound` with the fix. Why it exists apart from runtime/cpp_builder.py: the native
module is a base module (capture uses its guard checks) and must not import the runtime.
"""

from __future__ import annotations

import functools
import shutil
import subprocess

COMPILERS = ("g++", "c++", "clang++")


class CompilerNotFound(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def find_compiler() -> tuple[str, str]:
    """(path, version line) of the system C++ compiler."""
    for name in COMPILERS:
        path = shutil.which(name)
        if path:
            out = subprocess.run([path, "--version"], capture_output=True, text=True)
            return path, (out.stdout.splitlines() or ["unknown"])[0]
    raise CompilerNotFound(
        "kiln's CPU code generator needs a C++ compiler with OpenMP, and none of "
        f"{', '.join(COMPILERS)} is on PATH. Fix: install one (Debian/Ubuntu: "
        "`apt-get install g++`; Fedora: `dnf install gcc-c++`; macOS: `brew install gcc`), "
        "or use backend='aot_eager'."
    )
