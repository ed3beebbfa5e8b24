"""The Triton compile workers on a machine without a GPU: a worker given its parent's GPU
target compiles a kernel from Triton's specialization of a launch, for that target, without
torch and without a device, and fills Triton's cache; a job it cannot do is reported, not fatal.

(On the GPU, tests/codegen/triton/test_triton_gpu.py checks that the parent's first launches
then only load what the workers compiled.)
"""

from __future__ import annotations

import json
import os
import textwrap
import time

import pytest

triton = pytest.importorskip("triton")

from kiln.runtime import triton_workers  # noqa: E402

KERNELS = textwrap.dedent(
    """
    import triton
    import triton.language as tl


    @triton.jit
    def scale(x, y, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + i, tl.load(x + i, mask=i < n) * 2.5, mask=i < n)
    """
)
TARGET = ["cuda", 90, 32]


def _specialization(block: int) -> str:
    """What the parent's `jit_cache_hook` receives for `scale[grid](x, y, n, BLOCK=block)`
    with 16-byte-aligned float32 pointers."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import serialize_specialization_data

    options = make_backend(GPUTarget(*TARGET)).parse_options({"num_warps": 4})
    aligned = [["tt.divisibility", 16]]
    return serialize_specialization_data(
        "scale",
        {"x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        {(3,): block},
        {(0,): aligned, (1,): aligned},
        options,
        "key",
    )


def _nvidia_backend_problem() -> str | None:
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend

        make_backend(GPUTarget(*TARGET)).hash()  # finds ptxas and asks its version
    except Exception as e:
        return f"Triton's NVIDIA backend cannot compile here: {e!r}"
    return None


def _compile_offline(tmp_path, monkeypatch) -> None:
    """Workers compile for TARGET with no device (even on a GPU machine), into a fresh cache;
    skips where Triton's NVIDIA backend cannot compile."""
    problem = _nvidia_backend_problem()
    if problem:
        pytest.skip(problem)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the test session sets it


def test_worker_compiles_a_specialized_launch_without_torch_or_gpu(tmp_path, monkeypatch):
    _compile_offline(tmp_path, monkeypatch)
    module = tmp_path / "kernels.py"
    module.write_text(KERNELS)
    cache = tmp_path / "triton-cache"
    pool = triton_workers.WorkerPool(1, TARGET)
    try:
        job = {"path": str(module), "kernel": "scale", "specialization": _specialization(128)}
        bad = dict(job, kernel="missing")  # not in the module: reported, the pool goes on
        results = pool.run([job, bad])
    finally:
        pool.close()
    assert results["scale"] is None, results
    assert "missing" in results["missing"]
    cubins = [os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs if f.endswith(".cubin")]
    assert [os.path.basename(f) for f in cubins] == ["scale.cubin"]
    # the worker reports the hash Triton's cache files the kernel under (the parent loads it so)
    from triton.runtime.cache import get_cache_manager

    group = get_cache_manager(pool.hashes[f"{module}:scale"]).get_group("scale.json")
    assert group["scale.cubin"] == cubins[0]
    metadata = next(
        json.loads(open(os.path.join(d, f)).read())
        for d, _, files in os.walk(cache)
        for f in files
        if f == "scale.json"
    )
    assert metadata["target"]["arch"] == 90 and metadata["num_warps"] == 4


def test_jobs_of_two_modules_with_the_same_kernel_names_are_told_apart(tmp_path, monkeypatch):
    """A forward and a backward graph each have a `kernel0`: submitted one after the other and
    waited for separately, each gets its own answer, and a job given twice runs once."""
    _compile_offline(tmp_path, monkeypatch)
    paths = []
    for k in range(2):
        path = tmp_path / f"graph{k}.py"
        path.write_text(KERNELS)
        paths.append(str(path))
    forward = {"path": paths[0], "kernel": "scale", "specialization": _specialization(64)}
    backward = {"path": paths[1], "kernel": "scale", "specialization": _specialization(256)}
    broken = {"path": paths[1], "kernel": "scale", "specialization": "not json"}
    pool = triton_workers.WorkerPool(2, TARGET)
    try:
        first = pool.submit([forward])
        second = pool.submit([backward, forward])  # the forward's job again: not run twice
        assert pool.wait(second) == {f"{paths[1]}:scale": None, f"{paths[0]}:scale": None}
        assert pool.wait(first) == {f"{paths[0]}:scale": None}
        assert len(pool.seconds) == 2
        again = pool.run([broken])  # already compiled under that id: the answer stands
        assert again == {"scale": None}
    finally:
        pool.close()
    cubins = [f for _, _, files in os.walk(tmp_path) for f in files if f.endswith(".cubin")]
    assert len(cubins) == 2  # BLOCK 64 and 256


def test_worker_without_torch(run_python):
    """The worker script imports no torch for a specialized job (what makes it start fast)."""
    script = os.path.join(os.path.dirname(triton_workers.__file__), "triton_worker_main.py")
    probe = (
        "import runpy, sys; sys.argv = ['w', '[\"cuda\", 90, 32]']; "
        f"m = runpy.run_path({script!r}); m['_prepare'](sys.argv[1]); "
        "print('torch' in sys.modules)"
    )
    out = run_python("-c", probe, timeout=120)
    assert out.stdout.strip() == "False"


def test_kernels_with_the_same_signature_share_one_launcher_build(tmp_path, monkeypatch):
    """Triton writes a launcher from the argument types alone: the first worker to claim a
    signature builds it, a later kernel with the same types does not build it again."""
    import runpy

    script = os.path.join(os.path.dirname(triton_workers.__file__), "triton_worker_main.py")
    claim = runpy.run_path(script)["_claim_launcher"]
    monkeypatch.setenv("KILN_LAUNCHER_CLAIMS", str(tmp_path))
    pointwise = {"x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    assert claim(pointwise) is True
    assert claim(dict(pointwise)) is False  # same types: already claimed
    assert claim({**pointwise, "y": "*bf16"}) is True  # other types: another launcher
    assert len(os.listdir(tmp_path)) == 2
    monkeypatch.delenv("KILN_LAUNCHER_CLAIMS")
    assert claim(pointwise) is True  # no pool folder: every worker builds its own


def test_the_pool_removes_its_launcher_claims_when_closed(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    pool = triton_workers.WorkerPool(1)
    claims = pool._claims
    assert os.path.isdir(claims)
    pool.close(wait=True)
    assert not os.path.exists(claims)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the forked pool needs os.fork")
def test_a_pool_is_one_process_that_forks_its_workers(tmp_path, monkeypatch):
    """Three workers: one process started, two forked from it, each saying ready with its own
    process id; jobs compile (from modules that print as they load: the replies stay clean),
    and closing the pool ends all three."""
    _compile_offline(tmp_path, monkeypatch)
    jobs = []
    for k, block in enumerate((64, 128, 256)):  # one module each: three jobs, three ids
        path = tmp_path / f"graph{k}.py"
        path.write_text('print("noise on stdout")\n' + KERNELS)
        jobs.append(
            {"path": str(path), "kernel": "scale", "specialization": _specialization(block)}
        )
    pool = triton_workers.WorkerPool(3, TARGET)
    try:
        assert len(pool.procs) == 1 and len(pool.channels) == 3
        deadline = time.time() + 60
        while len(pool._ready) < 3 and time.time() < deadline:  # each says ready, with its pid
            pool._pump(timeout=1)
        pids = set(pool.pids.values())
        assert len(pids) == 3 and pool.procs[0].pid in pids
        results = pool.wait(pool.submit(jobs))
        assert all(r is None for r in results.values()), results
    finally:
        pool.close(wait=True)
    for pid in pids:  # the first process reaped its forks before it exited
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
