"""The C++ builder and its on-disk cache: hits, corrupt/truncated/foreign entries rebuilt and
never loaded, a directory others can write refused, a missing compiler explained and the graph
run eagerly instead.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.codegen import Declined, compile_graph
from kiln.native import compiler
from kiln.runtime import STATS, ArtifactCache, CacheUnsafe, CompilerNotFound, build, cpp_builder
from kiln.runtime.cache import ensure_private_dir, open_cache

SOURCE = """
#include <cstdint>
extern "C" void add_one(const float* a, float* out, int64_t n) {
  for (int64_t i = 0; i < 3; ++i) out[i] = a[i] + %s;
}
"""


def _fresh_source(tag: float) -> str:
    return SOURCE % f"{tag!r}f"


def _run(lib, values):
    a = torch.tensor(values, dtype=torch.float32)
    out = torch.empty(3)
    lib.add_one(a.data_ptr(), out.data_ptr(), 3)
    return out


@pytest.fixture
def cache_dir(tmp_path):
    d = tmp_path / "kiln-cache"
    yield str(d)
    open_cache.cache_clear()


def test_build_caches_on_disk_and_in_memory(cache_dir):
    tag = float(torch.randint(1, 1000, ()).item())
    src = _fresh_source(tag)
    before = dict(STATS)
    lib = build(src, {"add_one": 3}, cache_dir=cache_dir)
    x = torch.randn(3)
    torch.testing.assert_close(_run(lib, x.tolist()), x + tag)
    assert STATS["compiles"] == before["compiles"] + 1
    build(src, {"add_one": 3}, cache_dir=cache_dir)
    assert STATS["memory_hits"] == before["memory_hits"] + 1
    cpp_builder._loaded.clear()
    build(src, {"add_one": 3}, cache_dir=cache_dir)
    assert STATS["disk_hits"] == before["disk_hits"] + 1
    assert STATS["compiles"] == before["compiles"] + 1
    mode = os.stat(cache_dir).st_mode & 0o777
    assert mode & 0o022 == 0


def _rewrite(path, data: bytes) -> None:
    tmp = path + ".damaged"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _entry(cache_dir, src):
    key = cpp_builder.cache_key(src)
    return ArtifactCache(os.path.join(cache_dir, "cpp")).paths(key)


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "foreign", "no_meta"])
def test_damaged_entry_is_discarded_and_rebuilt(cache_dir, damage):
    tag = float(torch.randint(1000, 2000, ()).item())
    src = _fresh_source(tag)
    build(src, {"add_one": 3}, cache_dir=cache_dir)
    lib_path, meta_path = _entry(cache_dir, src)
    data = open(lib_path, "rb").read()
    # Damage goes through a new file: the loaded library's own pages must stay intact.
    if damage == "corrupt":
        _rewrite(lib_path, data[:100] + b"\x00garbage" + data[108:])
    elif damage == "truncated":
        _rewrite(lib_path, data[: len(data) // 2])
    elif damage == "foreign":
        meta = open(meta_path).read().split()
        meta[1] = "0" * 64
        _rewrite(meta_path, " ".join(meta).encode())
    else:
        os.unlink(meta_path)
    cpp_builder._loaded.clear()
    before = STATS["compiles"]
    lib = build(src, {"add_one": 3}, cache_dir=cache_dir)
    assert STATS["compiles"] == before + 1  # rebuilt, not loaded
    x = torch.randn(3)
    torch.testing.assert_close(_run(lib, x.tolist()), x + tag)
    assert open(lib_path, "rb").read() != b"" and os.path.exists(meta_path)


def test_group_writable_cache_dir_is_refused(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(CacheUnsafe, match="chmod 700"):
        ensure_private_dir(str(d))


def test_missing_compiler_is_a_clear_error_and_graph_runs_eagerly(monkeypatch):
    monkeypatch.setattr(compiler.shutil, "which", lambda name: None)
    cpp_builder.find_compiler.cache_clear()
    try:
        with pytest.raises(CompilerNotFound, match="apt-get install g\\+\\+"):
            cpp_builder.find_compiler()

        def fn(x):
            return (x.exp() + 1,)

        x = torch.randn(5)
        gm = make_fx(fn)(x)
        declined = compile_graph(gm, [x])
        assert isinstance(declined, Declined) and "apt-get install g++" in declined.reason
        # kiln.compile runs such a graph on eager ATen kernels, still correct
        compiled = kiln.compile(fn)
        y = torch.randn(5)
        compiled(y)
        torch.testing.assert_close(compiled(y)[0], y.exp() + 1)
    finally:
        cpp_builder.find_compiler.cache_clear()


def test_the_compiler_version_is_asked_once_per_cache(tmp_path, monkeypatch):
    """A new process finds the compiler's version line in the cache folder (no process start on
    a warm start); a compiler file that changed is asked again."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    fake = tmp_path / "bin" / "g++"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'g++ (kiln test) 1.0'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(compiler.shutil, "which", lambda name: str(fake))
    runs = []
    real_run = compiler.subprocess.run

    def counted(*args, **kwargs):
        runs.append(args[0])
        return real_run(*args, **kwargs)

    monkeypatch.setattr(compiler.subprocess, "run", counted)
    try:
        for _ in range(3):  # each cache_clear() stands for a new process
            cpp_builder.find_compiler.cache_clear()
            assert cpp_builder.find_compiler() == (str(fake), "g++ (kiln test) 1.0")
        assert len(runs) == 1
        fake.write_text("#!/bin/sh\necho 'g++ (kiln test) 2.0'\n")
        os.utime(fake, ns=(1, 1))
        cpp_builder.find_compiler.cache_clear()
        assert cpp_builder.find_compiler() == (str(fake), "g++ (kiln test) 2.0")
        assert len(runs) == 2
    finally:
        cpp_builder.find_compiler.cache_clear()
