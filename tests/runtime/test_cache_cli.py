"""`kiln cache info|clear`: counts what a compile stored, removes only kiln's own files, and a
compile after `clear` rebuilds and runs correctly."""

from __future__ import annotations

import os
import random


def _env(tmp_path) -> dict:
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    return dict(os.environ, PYTHONPATH=os.path.abspath(src), KILN_CACHE_DIR=str(tmp_path / "cache"))


def _compile_one(run_python, env) -> None:
    # a constant no other test uses: the kernel's source, so its cache key, is new
    c = random.uniform(1.5, 2.5)
    run_python(
        "-c",
        "import torch, kiln\n"
        f"f = kiln.compile(lambda x: (x * {c!r}).sin() + x)\n"
        "x = torch.randn(64)\n"
        f"torch.testing.assert_close(f(x), (x * {c!r}).sin() + x)\n",
        env=env,
    )


def test_info_and_clear(run_python, tmp_path):
    env = _env(tmp_path)
    _compile_one(run_python, env)
    out = run_python("-m", "kiln", "cache", "info", env=env).stdout
    line = next(x for x in out.splitlines() if x.strip().startswith("cpp:"))
    assert int(line.split()[1]) >= 1, out
    cpp = tmp_path / "cache" / "cpp"
    mine = [tmp_path / "cache" / "notes.txt", cpp / "README"]  # not kiln's: must stay
    for p in mine:
        p.write_text("keep me")
    out = run_python("-m", "kiln", "cache", "clear", env=env).stdout
    assert "removed" in out and not out.startswith("kiln cache: removed 0 ")
    assert all(p.read_text() == "keep me" for p in mine)
    left = [os.path.join(d, f) for d, _, fs in os.walk(cpp) for f in fs]
    assert left == [str(cpp / "README")], left
    out = run_python("-m", "kiln", "cache", "info", env=env).stdout
    assert "cpp: 0 entries" in out
    _compile_one(run_python, env)  # rebuilt, and right
    out = run_python("-m", "kiln", "cache", "info", env=env).stdout
    assert "cpp: 0 entries" not in out


def test_usage_errors(run_python, tmp_path):
    import subprocess
    import sys

    env = _env(tmp_path)
    bad = subprocess.run(
        [sys.executable, "-m", "kiln", "cache", "wipe"], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "usage: kiln cache info" in bad.stderr
