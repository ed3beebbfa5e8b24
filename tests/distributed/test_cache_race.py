"""Two processes (two torchrun ranks) compiling the same kernel at once into one fresh
KILN_CACHE_DIR: the cache is never left damaged and never pulled from under a writer.

The first process is given a slow file system (its library sits in the cache for ten seconds
before its metadata file lands); the second reaches the cache for the same kernel in that
window.
Both must load working kernels, the kernel is built once (the second waits for the first's
entry instead of discarding it as damaged and building its own), and the entry left verifies.
"""

from __future__ import annotations

import glob
import os
import time

import torch
import torch.multiprocessing as mp


def fn(x):
    return torch.sigmoid(x) * 3.0 + x.square()


def _rank(rank: int, cache_dir: str, results) -> None:
    os.environ["KILN_CACHE_DIR"] = cache_dir
    torch.set_num_threads(1)
    import kiln
    from kiln.backends.builtin import fallbacks
    from kiln.runtime import cache, cpp_builder

    libs = os.path.join(cache_dir, "cpp", "*", "*.so")
    if rank == 0:
        write = cache._atomic_write

        def slow_write(path, data):
            write(path, data)
            if path.endswith(".so"):
                time.sleep(10.0)

        cache._atomic_write = slow_write
    else:  # go to the cache when the first one's library is there without its metadata
        fetch = cache.ArtifactCache.fetch

        def late_fetch(self, key, produce):
            deadline = time.monotonic() + 120
            while not glob.glob(libs) and time.monotonic() < deadline:
                time.sleep(0.01)
            return fetch(self, key, produce)

        cache.ArtifactCache.fetch = late_fetch
    compiled = kiln.compile(fn)
    x = torch.randn(64)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), fn(x))
    assert not fallbacks(), [f.reason for f in fallbacks()]
    results.put((rank, cpp_builder.STATS["compiles"], cpp_builder.STATS["disk_hits"]))


def test_two_processes_compiling_one_kernel_share_a_fresh_cache(tmp_path):
    cache_dir = str(tmp_path / "cache")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, cache_dir, results)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    codes = [p.exitcode for p in procs]
    assert codes == [0, 0], f"a process failed: exit codes {codes}"
    stats = dict((r, (c, h)) for r, c, h in (results.get(timeout=5) for _ in procs))
    assert stats[0] == (1, 0), stats  # the first built it
    assert stats[1] == (0, 1), stats  # the second loaded the first's entry, not its own
    from kiln.runtime.cache import ArtifactCache

    metas = glob.glob(os.path.join(cache_dir, "cpp", "*", "*.meta"))
    assert len(metas) == 1
    key = os.path.basename(metas[0])[: -len(".meta")]
    assert ArtifactCache(os.path.join(cache_dir, "cpp")).lookup(key) is not None
    assert not glob.glob(os.path.join(cache_dir, "cpp", "*", ".tmp-*"))
