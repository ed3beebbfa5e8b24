"""The development gates that keep the map in docs/architecture.md true: the import-layer
contracts (kiln.devtools.layers), no import cycles, and the file-size budget."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kiln.devtools import layers

SRC = Path(layers.__file__).resolve().parents[1]
BUDGET = 800  # lines a source file may have (STYLE.md item 1)


def test_no_import_breaks_a_layer_contract():
    assert layers.violations() == []


def test_no_import_cycles_but_the_known_ones():
    found = {frozenset(group) for group in layers.cycles()}
    assert found - set(layers.KNOWN_CYCLES) == set(), "a new import cycle"
    assert set(layers.KNOWN_CYCLES) - found == set(), "a known cycle is gone: drop it from the list"


def test_the_checker_sees_an_upward_import():
    # capture importing a backend, lower importing codegen, a stage importing the package root
    found = [
        layers.Import("capture.frontend", "backends.registry", ("lookup_backend",), 1),
        layers.Import("lower.graph", "codegen.wrapper", ("x",), 2),
        layers.Import("runtime.cpp_builder", "", ("__version__",), 3),
        layers.Import("schedule.fusion", "lower.ir", ("Pointwise",), 4),  # allowed
    ]
    bad = layers.violations(found)
    assert len(bad) == 3
    assert "capture imports backends.registry" in bad[0]
    assert "lower imports codegen.wrapper" in bad[1]
    assert "__version__ from the package root" in bad[2]


def test_the_checker_runs_as_a_command():
    out = subprocess.run(
        [sys.executable, "-m", "kiln.devtools.layers"], capture_output=True, text=True
    )
    assert "capture" in out.stdout and "->" in out.stdout
    assert out.returncode == 0, out.stdout


def test_every_source_file_is_within_the_size_budget():
    over = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > BUDGET
    }
    assert over == {}, f"split these by concern (STYLE.md item 1): {over}"
