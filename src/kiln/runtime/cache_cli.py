"""`kiln cache info|clear`: what kiln's on-disk caches hold, and emptying them safely.

Takes the cache folders options.py names (`KILN_CACHE_DIR`: built C++ libraries in `cpp/`,
Triton kernel sources in `triton/`, compiled graphs for the warm start in `aot/`;
`KILN_NATIVE_DIR`: the native guard checks); gives a summary per cache (entries, bytes,
temporary files left by killed writers) and `clear`, which removes only files kiln itself
writes there (`<key>.so|.py|.art|.meta|.lock` in `<kind>/<2 hex>/`, their `.tmp-*` files, and
with `--native` the `kiln_native_*` modules). A cache folder a user pointed somewhere odd
(`KILN_CACHE_DIR=$HOME`) is never emptied wholesale. Loaded libraries stay mapped in processes
that use them; the next process rebuilds what it needs.
"""

from __future__ import annotations

import os
import re
import sys

from .. import options

KINDS = {"cpp": (".so",), "triton": (".py",), "aot": (".art",)}  # aot: compiled graphs
_KEY = re.compile(r"^[0-9a-f]{16,128}$")
_SHARD = re.compile(r"^[0-9a-f]{2}$")


def _kiln_files(root: str, kind: str):
    """(path, is_temporary) of every file kiln wrote in `<root>/<kind>`."""
    base = os.path.join(root, kind)
    if not os.path.isdir(base):
        return
    suffixes = (*KINDS[kind], ".meta", ".lock")
    for shard in sorted(os.listdir(base)):
        folder = os.path.join(base, shard)
        if not _SHARD.match(shard) or not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if name.startswith(".tmp-"):
                yield path, True
            elif name.endswith(suffixes) and _KEY.match(name.rsplit(".", 1)[0]):
                yield path, False


def _native_files(folder: str):
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if name.startswith("kiln_native_"):
                yield os.path.join(folder, name), name.endswith(".tmp")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def info() -> list[str]:
    root = options.env_cache_dir()
    lines = [f"kernel cache: {root}"]
    for kind in KINDS:
        files = list(_kiln_files(root, kind))
        entries = sum(1 for p, tmp in files if not tmp and p.endswith(KINDS[kind]))
        temps = sum(1 for _, tmp in files if tmp)
        size = sum(_size(p) for p, _ in files)
        lines.append(
            f"  {kind}: {entries} entries, {size / 1e6:.1f} MB"
            + (f", {temps} temporary file(s) of killed writers" if temps else "")
        )
    _, native_dir = options.env_native()
    natives = list(_native_files(native_dir))
    lines.append(
        f"native checks: {native_dir}: {len(natives)} file(s), "
        f"{sum(_size(p) for p, _ in natives) / 1e6:.1f} MB"
    )
    return lines


def clear(native: bool = False) -> tuple[int, int]:
    """Remove kiln's cache files (and the native modules when `native`); gives (files, bytes)."""
    root = options.env_cache_dir()
    paths = [p for kind in KINDS for p, _ in _kiln_files(root, kind)]
    if native:
        paths += [p for p, _ in _native_files(options.env_native()[1])]
    count = size = 0
    for path in paths:
        n = _size(path)
        try:
            os.remove(path)
        except OSError:
            continue
        count, size = count + 1, size + n
    for kind in KINDS:  # shards left empty
        base = os.path.join(root, kind)
        for shard in os.listdir(base) if os.path.isdir(base) else ():
            if _SHARD.match(shard):
                try:
                    os.rmdir(os.path.join(base, shard))
                except OSError:
                    pass
    return count, size


def main(argv: list[str]) -> int:
    usage = "usage: kiln cache info | kiln cache clear [--native]"
    if argv == ["info"]:
        print("\n".join(info()))
        return 0
    if argv and argv[0] == "clear" and set(argv[1:]) <= {"--native"}:
        count, size = clear(native="--native" in argv[1:])
        print(f"kiln cache: removed {count} file(s), {size / 1e6:.1f} MB")
        return 0
    print(usage, file=sys.stderr if argv not in ([], ["-h"], ["--help"]) else sys.stdout)
    return 0 if argv in ([], ["-h"], ["--help"]) else 2
