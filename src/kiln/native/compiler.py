"""The system C++ compiler: which one kiln builds with (the native module, the CPU kernels).

Takes nothing; gives `find_compiler()` -> (path, version line), cached for the process, or
`CompilerNotFound` with the fix. Why it exists apart from runtime/cpp_builder.py: the native
module is a base module (capture uses its guard checks) and must not import the runtime.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess

from .. import options
from ..version import write_kept

COMPILERS = ("g++", "c++", "clang++")


class CompilerNotFound(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def find_compiler() -> tuple[str, str]:
    """(path, version line) of the system C++ compiler."""
    for name in COMPILERS:
        path = shutil.which(name)
        if path:
            return path, _version(path)
    raise CompilerNotFound(
        "kiln's CPU code generator needs a C++ compiler with OpenMP, and none of "
        f"{', '.join(COMPILERS)} is on PATH. Fix: install one (Debian/Ubuntu: "
        "`apt-get install g++`; Fedora: `dnf install gcc-c++`; macOS: `brew install gcc`), "
        "or use backend='aot_eager'."
    )


def _version(path: str) -> str:
    """The compiler's `--version` line, kept in kiln's cache folder under the compiler file's
    identity (resolved path, size, modification time, inode): running it is a process start
    (5-15 ms) that every new process paid on its warm start, for the cache keys."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
        ident = f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"
        name = hashlib.sha256(ident.encode()).hexdigest()[:32]
        kept = os.path.join(options.env_cache_dir(), "compilers", name)
    except OSError:
        kept = None
    if kept is not None:
        try:
            with open(kept) as f:
                line = f.read()
            if line:
                return line
        except OSError:
            pass
    out = subprocess.run([path, "--version"], capture_output=True, text=True)
    line = (out.stdout.splitlines() or ["unknown"])[0]
    if kept is not None and out.returncode == 0:
        write_kept(kept, line)
    return line
