"""The capture cache (capture/capture_cache.py): a new process runs the entry a former process
kept for the frame instead of capturing, only when everything the trace relied on still holds.

One cold process compiles a small module (a global, another module's attribute, a config value,
a helper function, int/float arguments, the training flag) and keeps its capture; each test then
changes one of those things and runs a new process on a copy of that cache. Every process
compares the compiled result with eager PyTorch on fresh random data (first and second call),
and reports whether the kept capture was used. A change the trace relied on must be captured
again; with nothing changed the kept capture must be used (so the cache is really on here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")

BASE = {
    "scale": 2.0,
    "factor": 3.0,
    "helper_op": "+",
    "use_bias": True,
    "class_shift": 0.5,
    "dtype": "float32",
    "shape": [4, 8],
    "rg": False,
    "k": 1,
    "f": 1.0,
    "train": False,
    "program": "plain",
}

CFG = """
FACTOR = {factor}
"""

NET = """
import torch
import cfgmod

SCALE = {scale}
EVENTS = []
NAMES = ("alpha", "beta", "gamma", "delta")


def helper(x):
    return x {helper_op} 1.0


class Config:
    def __init__(self, use_bias):
        self.use_bias = use_bias


class Net(torch.nn.Module):
    SHIFT = {class_shift}

    def __init__(self, use_bias):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.config = Config(use_bias)

    def forward(self, x, k=1, f=1.0):
        y = self.lin(x) * SCALE * cfgmod.FACTOR + self.SHIFT
        if self.config.use_bias:
            y = y + 1
        if self.training:
            y = y * 2
        return helper(y) * k + f


class Breaks(Net):
    def forward(self, x, k=1, f=1.0):
        y = self.lin(x)
        if y.sum() > -1e9:  # a tensor's truth value: a graph break
            y = y * SCALE
        return y + k


class Effects(Net):
    def forward(self, x, k=1, f=1.0):
        y = self.lin(x) * SCALE
        EVENTS.append(k)  # an outside list changed: a side effect
        return y


class Ids(Net):
    def forward(self, x, k=1, f=1.0):
        return self.lin(x) + id(self.lin) % 1000  # another number in another process


class SetOrder(Net):
    def forward(self, x, k=1, f=1.0):
        y = self.lin(x)
        for name in set(NAMES):  # string hashes: a per-process order
            y = y * 0.5 + len(name)
        return y
"""

DRIVER = """
import json, sys, torch, kiln
from kiln.capture import capture_cache
import netmod

knobs = json.loads(sys.argv[1])
torch.manual_seed(0)
programs = {"plain": netmod.Net, "breaks": netmod.Breaks, "effects": netmod.Effects,
            "ids": netmod.Ids, "set_order": netmod.SetOrder}
cls = programs[knobs["program"]]
model = cls(knobs["use_bias"]).to(getattr(torch, knobs["dtype"]))
model.train(knobs["train"])
compiled = kiln.compile(model)
worst = 0.0
for seed in (int(sys.argv[2]), int(sys.argv[2]) + 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*knobs["shape"], generator=g, dtype=getattr(torch, knobs["dtype"]))
    x.requires_grad_(knobs["rg"])
    got = compiled(x, knobs["k"], knobs["f"])
    want = model(x, knobs["k"], knobs["f"])
    worst = max(worst, (got - want).abs().max().item())
print(json.dumps({**capture_cache.STATS, "worst": worst}))
"""


def _write(folder, knobs: dict) -> None:
    (folder / "cfgmod.py").write_text(textwrap.dedent(CFG.format(**knobs)))
    (folder / "netmod.py").write_text(textwrap.dedent(NET.format(**knobs)))
    (folder / "driver.py").write_text(textwrap.dedent(DRIVER))


def _run(folder, cache: str, seed: int = 1, logs: str = "", **changes) -> dict:
    knobs = {**BASE, **changes}
    _write(folder, knobs)
    env = {
        **os.environ,
        "KILN_CACHE_DIR": cache,
        "KILN_ARTIFACT_CACHE": "1",  # the suite runs with it off (conftest.py)
        "PYTHONPATH": os.pathsep.join([SRC, str(folder)]),
        "PYTHONDONTWRITEBYTECODE": "1",  # sources are rewritten within one second
        "KILN_LOGS": logs,
    }
    out = subprocess.run(
        [sys.executable, str(folder / "driver.py"), json.dumps(knobs), str(seed)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["log"] = out.stderr
    return result


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """The program's folder and a cache a cold process filled."""
    folder = tmp_path_factory.mktemp("capture_cache_program")
    cache = str(folder / "cold_cache")
    first = _run(folder, cache)
    assert first["stored"] == 1 and first["hits"] == 0, first
    assert first["worst"] < 1e-5
    return folder, cache


def _warm(cold, tmp_path, **changes) -> dict:
    folder, cache = cold
    copy = str(tmp_path / "cache")
    shutil.copytree(cache, copy)
    return _run(folder, copy, seed=7, logs="capture_cache", **changes)


def test_unchanged_program_uses_the_kept_capture(cold, tmp_path):
    warm = _warm(cold, tmp_path)
    assert warm["hits"] == 1, warm["log"][-2000:]
    assert warm["worst"] < 1e-5


@pytest.mark.parametrize(
    "change",
    [
        {"scale": 5.0},  # a global the frame reads
        {"factor": -1.5},  # another module's attribute
        {"use_bias": False},  # a config value read in forward
        {"class_shift": 4.0},  # a class attribute
        {"helper_op": "-"},  # a function's code
        {"dtype": "float64"},
        {"shape": [5, 8]},
        {"rg": True},
        {"k": 3},  # a Python int argument
        {"f": 2.5},  # a Python float argument
        {"train": True},
    ],
    ids=lambda c: next(iter(c)),
)
def test_a_change_is_captured_again(cold, tmp_path, change):
    warm = _warm(cold, tmp_path, **change)
    assert warm["worst"] < 1e-5, warm
    assert warm["hits"] == 0, f"the kept capture ran after {change}: {warm['log'][-2000:]}"
    assert "kept capture not used" in warm["log"]


@pytest.mark.parametrize("program", ["breaks", "effects", "ids", "set_order"])
def test_what_holds_in_one_process_only_is_not_kept(tmp_path, program):
    """A graph break, a side effect to replay, an `id()`, a set's per-process order."""
    cache = str(tmp_path / "cache")
    for seed in (1, 5):
        run = _run(tmp_path, cache, seed=seed, logs="capture_cache", program=program)
        assert run["worst"] < 1e-5, run
        assert run["hits"] == 0 and run["stored"] == 0, run["log"][-2000:]
        assert "not kept for other processes" in run["log"]


@pytest.mark.parametrize("damage", ["truncate", "garble"])
def test_a_damaged_entry_is_captured_again(cold, tmp_path, damage):
    folder, cache = cold
    copy = str(tmp_path / "cache")
    shutil.copytree(cache, copy)
    paths = [
        os.path.join(d, n)
        for d, _, names in os.walk(copy)
        for n in names
        if n.startswith("capture-") and n.endswith(".art")
    ]
    assert len(paths) == 1
    data = open(paths[0], "rb").read()
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = data[:-40] + bytes(b ^ 0x5A for b in data[-40:])
    open(paths[0], "wb").write(data)
    warm = _run(folder, copy, seed=9, logs="capture_cache")
    assert warm["worst"] < 1e-5
    assert warm["hits"] == 0 and warm["stored"] == 1, warm["log"][-2000:]
    again = _run(folder, copy, seed=11)  # the entry written anew serves the next process
    assert again["hits"] == 1 and again["worst"] < 1e-5
