"""Fixtures shared by the runtime tests."""

import pytest

import kiln
from kiln import logs


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh kiln cache folder with the compiled-artifact cache on (the suite runs with it off,
    tests/conftest.py), and kiln's state and logs reset around the test; gives the folder."""
    root = str(tmp_path / "cache")
    monkeypatch.setenv("KILN_CACHE_DIR", root)
    monkeypatch.setenv("KILN_ARTIFACT_CACHE", "1")
    kiln.reset()
    yield root
    kiln.reset()
    logs.set_logs()
