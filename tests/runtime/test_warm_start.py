"""The warm start: a compiled graph kept on disk is loaded by a new process (backends/warm.py,
runtime/artifacts.py), and the cache stays sound when its files are damaged, written by two
processes at once, left half-written by a killed writer, made by other code, or cannot be
written at all. Every run compares kiln's outputs and gradients with eager's on fresh data."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln.backends import warm
from kiln.runtime import artifacts

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")

PROGRAM = textwrap.dedent(
    """
    import json, sys, torch, kiln
    from kiln.backends import warm

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 8)
    )
    compiled = kiln.compile(model)
    worst = 0.0
    for seed in (int(sys.argv[1]), int(sys.argv[1]) + 1):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(seed))
        got = compiled(x)
        got.square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        want = model(x)
        want.square().sum().backward()
        for g, p in zip(grads, model.parameters()):
            worst = max(worst, (g - p.grad).abs().max().item())
        model.zero_grad()
        worst = max(worst, (got - want).abs().max().item())
        with torch.no_grad():  # the inference entry
            worst = max(worst, (compiled(x) - model(x)).abs().max().item())
    lowered, sympy = "kiln.lower" in sys.modules, "sympy" in sys.modules
    triton = "kiln.runtime.triton_builder" in sys.modules
    print(json.dumps({**warm.STATS, "worst": worst, "lowered": lowered, "sympy": sympy,
                      "triton": triton}))
    """
)


def _run(tmp_path, cache: str, seed: int = 1, **env_extra) -> dict:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = {**os.environ, "KILN_CACHE_DIR": cache, "PYTHONPATH": SRC, "KILN_ARTIFACT_CACHE": "1"}
    env.update(env_extra)
    out = subprocess.run(
        [sys.executable, str(script), str(seed)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_new_process_loads_instead_of_compiling(tmp_path):
    cache = str(tmp_path / "cache")
    cold = _run(tmp_path, cache, seed=1)
    assert cold["worst"] < 1e-4
    assert cold["hits"] == 0 and cold["stored"] == 2  # the training and the inference entry
    hot = _run(tmp_path, cache, seed=7)  # other data than the compile saw
    assert hot["worst"] < 1e-4
    assert hot["hits"] == 2 and hot["misses"] == 0
    assert not hot["lowered"], "a warm start imported the lowering modules"
    assert not hot["sympy"], "a warm start of a graph with static sizes imported sympy"
    assert not hot["triton"], "a warm start on the CPU imported the Triton builder"
    off = _run(tmp_path, cache, seed=3, KILN_ARTIFACT_CACHE="0")
    assert off["hits"] == 0 and off["lowered"] and off["worst"] < 1e-4


def test_two_processes_compile_the_same_graph_at_once(tmp_path):
    cache = str(tmp_path / "cache")
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = {**os.environ, "KILN_CACHE_DIR": cache, "PYTHONPATH": SRC, "KILN_ARTIFACT_CACHE": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(seed)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["worst"] < 1e-4
    after = _run(tmp_path, cache, seed=5)
    assert after["hits"] == 2 and after["worst"] < 1e-4
    assert not any(e[1].startswith(".tmp-") for e in artifacts.entries(cache))


# -- in one process: each compile below is a fresh kiln.compile after kiln.reset() ------------


def _step(fn, seed: int) -> float:
    """One compiled call and backward of `fn` against eager on fresh data; the worst error."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 12, generator=gen)
    w = torch.randn(12, 12, generator=gen, requires_grad=True)
    compiled = kiln.compile(fn)
    got = compiled(x, w)
    (gw,) = torch.autograd.grad(got.sum(), w)
    want = fn(x, w)
    (ww,) = torch.autograd.grad(want.sum(), w)
    kiln.reset()
    return max((got - want).abs().max().item(), (gw - ww).abs().max().item())


def f(x, w):
    return torch.tanh(x @ w).softmax(-1) * 2.0


@contextlib.contextmanager
def _kiln_warnings():
    """The messages of kiln's warnings (logs.warn) while the block runs."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    handler = Keep()
    logger = logging.getLogger("kiln.fallbacks")
    logger.addHandler(handler)
    try:
        yield said
    finally:
        logger.removeHandler(handler)


def _art_files(root: str) -> list[str]:
    return [p for kind, _, paths, _, _ in artifacts.entries(root) if kind == "aot" for p in paths]


def _counts() -> dict:
    return dict(warm.STATS)


def _delta(before: dict) -> dict:
    return {k: warm.STATS[k] - before[k] for k in before}


def test_truncated_and_corrupted_entries_are_rebuilt(cache):
    before = _counts()
    assert _step(f, 1) < 1e-4
    (path,) = _art_files(cache)
    assert _delta(before)["stored"] == 1
    for damage in ("truncate", "flip"):
        raw = open(path, "rb").read()
        if damage == "truncate":
            raw = raw[: len(raw) - 40]
        else:
            raw = raw[:-10] + bytes([raw[-10] ^ 0xFF]) + raw[-9:]
        open(path, "wb").write(raw)
        before = _counts()
        with _kiln_warnings() as said:
            assert _step(f, 2) < 1e-4
        assert "discarding compiled graph" in " ".join(said), said
        assert _delta(before) == {"hits": 0, "misses": 1, "stored": 1, "not_cached": 0}
        before = _counts()
        assert _step(f, 3) < 1e-4  # rebuilt: a hit again
        assert _delta(before)["hits"] == 1


def test_killed_writer_leaves_nothing_that_is_loaded(cache):
    assert _step(f, 1) < 1e-4
    (path,) = _art_files(cache)
    raw = open(path, "rb").read()
    folder = os.path.dirname(path)
    # a writer killed before its rename leaves a temporary file; one killed mid-way through a
    # plain write (not kiln's way, but a copy or a crash of the file system) a partial entry
    with open(os.path.join(folder, ".tmp-killed"), "wb") as out:
        out.write(raw[: len(raw) // 2])
    with open(path, "wb") as out:
        out.write(raw[: len(raw) // 3])
    before = _counts()
    with _kiln_warnings() as said:
        assert _step(f, 2) < 1e-4
    assert "truncated" in " ".join(said)
    assert _delta(before)["misses"] == 1 and _delta(before)["stored"] == 1
    from kiln.runtime import cache_cli

    assert "1 temporary file(s) of killed writers" in "\n".join(cache_cli.info())
    count, _ = cache_cli.clear()
    assert count >= 2
    assert not os.path.exists(os.path.join(folder, ".tmp-killed"))
    assert _art_files(cache) == []


def test_other_code_misses(cache, monkeypatch):
    assert _step(f, 1) < 1e-4
    before = _counts()
    monkeypatch.setattr(warm, "source_digest", lambda: "another kiln")
    assert _step(f, 2) < 1e-4
    assert _delta(before) == {"hits": 0, "misses": 1, "stored": 1, "not_cached": 0}
    assert len(_art_files(cache)) == 2


def test_full_disk_warns_once_and_runs_on(cache, monkeypatch):
    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(artifacts, "_atomic_write", full)
    monkeypatch.setattr(artifacts, "_warned_write", False)

    def g(x, w):
        return torch.relu(x @ w) + x.mean()

    with _kiln_warnings() as said:
        assert _step(f, 1) < 1e-4
        assert _step(g, 2) < 1e-4
    assert len([m for m in said if "the disk is full" in m]) == 1, said
    assert _art_files(cache) == []


def test_least_recently_used_entries_go_first(tmp_path):
    store = artifacts.ArtifactStore(str(tmp_path))
    for i, key in enumerate(("aa" + "0" * 62, "bb" + "0" * 62, "cc" + "0" * 62)):
        assert store.put(key, os.urandom(1000))
        os.utime(store.path(key), (1000 + i, 1000 + i))
    assert store.get("aa" + "0" * 62) is not None  # used now: the newest
    removed = artifacts.evict(str(tmp_path), 3000)  # three entries of ~1.2 kB
    assert removed > 0
    left = {e[1] for e in artifacts.entries(str(tmp_path))}
    assert left == {"aa" + "0" * 62, "cc" + "0" * 62}


def test_saved_artifacts_warm_another_cache(cache, tmp_path, monkeypatch):
    assert _step(f, 1) < 1e-4
    blob = kiln.save_cache_artifacts()
    other = str(tmp_path / "other")
    monkeypatch.setenv("KILN_CACHE_DIR", other)
    assert kiln.load_cache_artifacts(blob) > 0
    before = _counts()
    assert _step(f, 2) < 1e-4
    assert _delta(before)["hits"] == 1
    line, _, body = blob.partition(b"\n")
    header = json.loads(line.split(b" ", 1)[1])
    header["environment"]["torch"] = "1.0.0"
    forged = line.split(b" ", 1)[0] + b" " + json.dumps(header).encode() + b"\n" + body
    with pytest.raises(ValueError, match="torch: blob '1.0.0'"):
        kiln.load_cache_artifacts(forged)
    with pytest.raises(ValueError, match="not a blob"):
        kiln.load_cache_artifacts(b"hello")


def test_dynamic_and_static_graphs_never_share_an_entry():
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def h(x):
        return (x * 2).sum(0)

    for dynamic in (False, True):
        kiln.reset()
        x = torch.randn(6, 3)
        torch.testing.assert_close(kiln.compile(h, backend=keep, dynamic=dynamic)(x), h(x))
    kiln.reset()
    static, dynamic = (warm.graph_key(g) for g in graphs)
    assert static != dynamic


DYNAMIC = textwrap.dedent(
    """
    import json, sys, torch, kiln
    from kiln.backends import warm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))

    def step(x):
        y = model(x)
        return y.softmax(-1) * x.shape[0], y.view(-1, 2)  # a size and a view of symbolic sizes

    compiled = kiln.compile(step, dynamic=True)
    worst = 0.0
    for rows in map(int, sys.argv[1].split(",")):
        x = torch.randn(rows, 8, generator=torch.Generator().manual_seed(rows))
        got = compiled(x)
        sum(g.square().sum() for g in got).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        want = step(x)
        sum(w.square().sum() for w in want).backward()
        for g, p in zip(grads, model.parameters()):
            worst = max(worst, (g - p.grad).abs().max().item())
        model.zero_grad()
        for g, w in zip(got, want):
            assert g.shape == w.shape, (g.shape, w.shape)
            worst = max(worst, (g - w).abs().max().item())
    lowered = "kiln.lower" in sys.modules
    print(json.dumps({**warm.STATS, "worst": worst, "lowered": lowered}))
    """
)


def test_dynamic_entry_serves_other_sizes_in_a_new_process(tmp_path):
    script = tmp_path / "dynamic.py"
    script.write_text(DYNAMIC)
    env = {
        **os.environ,
        "KILN_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": SRC,
        "KILN_ARTIFACT_CACHE": "1",
    }

    def run(sizes: str) -> dict:
        out = subprocess.run(
            [sys.executable, str(script), sizes], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold = run("5")
    assert cold["worst"] < 1e-4 and cold["stored"] == 1 and cold["not_cached"] == 0, cold
    hot = run("7,12,3")  # sizes the compile never saw, one entry for all of them
    assert hot["worst"] < 1e-4, hot
    assert hot["hits"] == 1 and hot["misses"] == 0 and hot["stored"] == 0, hot
    assert not hot["lowered"], "a warm start of a dynamic graph compiled it again"
    # the entry checks every fact of its trace's shape environment, capture's (its size
    # specialization, rows != 1) as well as AOT tracing's: another process's capture may have
    # recorded other facts (it saw other sizes first) that do not imply what this trace assumed
    store = artifacts.open_store(str(tmp_path / "cache"))
    (key,) = [e[1] for e in artifacts.entries(str(tmp_path / "cache")) if e[0] == "aot"]
    entry = warm.unpack(store.get(key), owner=object(), key=())
    assert "a[0].size(0) != 1" in entry.text, entry.text
    assert "a[0].size(0) >= 2" in entry.text, entry.text
    assert entry.check([torch.randn(5, 8)]) and not entry.check([torch.randn(1, 8)])
