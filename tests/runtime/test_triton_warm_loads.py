"""A warm start starts no Triton compile worker: kernels the workers built in an earlier process
are loaded from Triton's cache by the hashes kiln recorded (runtime/triton_builder.py), and the
inductor backend starts the workers early only when it compiles a graph, not when the compiled
-artifact cache gives it (backends/builtin.py).

This machine has no GPU: the builder runs with stand-ins for the device check, for Triton's
specialization of each launch and for the load from Triton's cache, and with a stand-in pool
that records what it was asked to compile (the GPU run, tests/codegen/triton, checks the
real path). The backend test runs real kiln compiles on the CPU and checks them against eager.
"""

from __future__ import annotations

import types

import pytest
import torch

import kiln
from kiln.backends import builtin
from kiln.runtime import triton_builder, triton_workers


class StandInPool:
    """Compiles every job it is given into 'Triton's cache' (`BUILT`), reporting a hash."""

    def __init__(self) -> None:
        self.started = 0.0
        self.jobs: list[dict] = []
        self.hashes: dict[str, str] = {}
        self.seconds: dict[str, float] = {}
        self.ready_after: dict[int, float] = {}
        self.channels: list = []

    def submit(self, jobs: list[dict]) -> list[str]:
        self.jobs += jobs
        ids = [f"job{len(self.jobs)}-{job['kernel']}" for job in jobs]
        for job_id, job in zip(ids, jobs):
            self.hashes[job_id] = f"hash-of-{job['specialization']}"
            BUILT.add(self.hashes[job_id])
        return ids

    def as_completed(self, ids, meanwhile=None):
        for job_id in ids:
            yield job_id, None


BUILT: set[str] = set()  # the hashes in "Triton's cache"


@pytest.fixture
def gpu(tmp_path, monkeypatch):
    """The builder as on a GPU machine, with an empty kiln cache; gives the started pools and
    the kernels loaded by hash, as (kernel, specialization, hash)."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(triton_builder.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(triton_builder, "_target", lambda: ["cuda", 90, 32])
    specs = {"k0": "spec-a", "k1": "spec-b", "k2": "spec-c"}
    monkeypatch.setattr(
        triton_builder, "specializations", lambda module, launches: {k: specs[k] for k in launches}
    )
    pools: list[StandInPool] = []

    def start(workers, target):
        pools.append(StandInPool())
        return pools[-1]

    monkeypatch.setattr(triton_workers, "start", start)
    loaded: list[tuple] = []

    def preload(jit, specialization, kernel_hash):
        if kernel_hash not in BUILT:  # Triton's cache lost it: not loaded
            return False
        loaded.append((jit.name, specialization, kernel_hash))
        return True

    monkeypatch.setattr(triton_builder, "_preload", preload)
    BUILT.clear()
    return types.SimpleNamespace(pools=pools, loaded=loaded, specs=specs)


def _module(names):
    return types.SimpleNamespace(**{n: types.SimpleNamespace(name=n, src="x" * 10) for n in names})


LAUNCHES = {name: ([torch.float32], [4], {}, 4) for name in ("k0", "k1", "k2")}


def test_kernels_built_before_load_without_workers(gpu):
    path = "/somewhere/abc123.py"
    module = _module(LAUNCHES)
    finish = triton_builder.warm(path, module, LAUNCHES)  # a cold process: the pool compiles
    assert finish is not None and len(gpu.pools) == 1
    finish()
    assert sorted(k for k, _, _ in gpu.loaded) == ["k0", "k1", "k2"]
    gpu.loaded.clear()
    # a new process (the same kiln cache and Triton cache): loaded by hash, no worker starts
    assert triton_builder.warm(path, _module(LAUNCHES), LAUNCHES) is None
    assert len(gpu.pools) == 1
    assert sorted(gpu.loaded) == [
        (k, gpu.specs[k], f"hash-of-{gpu.specs[k]}") for k in ("k0", "k1", "k2")
    ]


def test_what_the_record_cannot_vouch_for_is_compiled(gpu):
    path = "/somewhere/def456.py"
    triton_builder.warm(path, _module(LAUNCHES), LAUNCHES)()
    gpu.loaded.clear()
    # another specialization of k1 (another alignment, say), and k2's binary gone from
    # Triton's cache: both go to the workers, k0 is loaded by its hash
    gpu.specs["k1"] = "spec-b2"
    BUILT.discard("hash-of-spec-c")
    finish = triton_builder.warm(path, _module(LAUNCHES), LAUNCHES)
    assert finish is not None and len(gpu.pools) == 2
    assert sorted(j["kernel"] for j in gpu.pools[1].jobs) == ["k1", "k2"]
    assert [k for k, _, _ in gpu.loaded] == ["k0"]
    finish()
    # the record now holds the new hashes: the next process starts no worker
    gpu.loaded.clear()
    assert triton_builder.warm(path, _module(LAUNCHES), LAUNCHES) is None
    assert len(gpu.pools) == 2 and len(gpu.loaded) == 3
    # another module (other source) has no record: its kernels are compiled
    assert triton_builder.warm("/somewhere/other.py", _module(LAUNCHES), LAUNCHES) is not None
    assert len(gpu.pools) == 3


def test_the_backend_starts_workers_only_to_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KILN_ARTIFACT_CACHE", "1")  # the suite runs with it off (conftest.py)
    starts: list[int] = []
    monkeypatch.setattr(builtin, "_prestart_compile_workers", lambda inputs: starts.append(1))

    def f(x, w):
        return torch.tanh(x @ w) * 3.0

    for seed, want_starts in ((1, 1), (2, 1)):  # compiled, then given by the artifact cache
        kiln.reset()
        gen = torch.Generator().manual_seed(seed)
        x, w = torch.randn(6, 5, generator=gen), torch.randn(5, 5, generator=gen)
        torch.testing.assert_close(kiln.compile(f)(x, w), f(x, w))
        assert len(starts) == want_starts
    kiln.reset()
