"""`kiln doctor` and `kiln native --status` say which path the native checks take, and start
no build while asking."""

from __future__ import annotations

import os
import sys


def _env(**extra) -> dict:
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    env = {k: v for k, v in os.environ.items() if k != "KILN_NATIVE"}
    return dict(env, PYTHONPATH=os.path.abspath(src), **extra)


def test_doctor_says_not_built_and_builds_nothing(run_python, tmp_path):
    folder = tmp_path / "native"
    out = run_python("-m", "kiln", "doctor", env=_env(KILN_NATIVE_DIR=str(folder)))
    assert "C++ compiler:" in out.stdout and "kernel cache:" in out.stdout
    line = next(x for x in out.stdout.splitlines() if x.startswith("native checks:"))
    assert "not built yet" in line and "`kiln native` builds it now" in line, out.stdout
    assert not folder.exists() or not list(folder.iterdir())  # asking started no build


def test_native_status_says_off_and_loaded(run_python):
    out = run_python("-m", "kiln", "native", "--status", env=_env(KILN_NATIVE="0"))
    assert "off, guards run in Python: KILN_NATIVE=0" in out.stdout
    # the suite's own folder has it built (conftest builds it before any test)
    out = run_python("-m", "kiln", "native", "--status", env=_env())
    assert "loaded from" in out.stdout and sys.implementation.cache_tag in out.stdout
