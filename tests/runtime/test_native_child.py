"""The native module's background build never outlives the process that started it.

A fresh process with an empty `KILN_NATIVE_DIR` compiles a function (which starts the build in
the background), waits until the compiler is running, and exits at once. Afterwards no process
carrying that run's marker in its environment (the compiler driver, `cc1plus`, the assembler
and linker inherit it) may remain. The build also runs at the lowest CPU priority (nice 19), so
that it only takes time the user's own work leaves idle.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
    reason="the native build needs Linux and a C++ compiler",
)

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def marked(marker: str) -> list[tuple[int, str]]:
    """(pid, command) of every live process whose environment holds `marker`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie has finished; its parent reaps it
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append((int(pid), f.read().replace(b"\0", b" ").decode()[:200]))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    import torch, kiln
    from kiln import native
    from test_native_child import marked

    # a module's parameters are checked by a guard table: the first one starts the build
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    f = kiln.compile(net, backend="eager")
    x = torch.randn(3, 4)
    torch.testing.assert_close(f(x), net(x))
    status = native.status()[0]
    assert status == "building", status
    deadline = time.time() + 30
    while not marked(os.environ["KILN_CHILD_MARKER"]):  # wait for the compiler to start
        assert time.time() < deadline, "no build process started"
        time.sleep(0.05)
    time.sleep(0.5)  # let the driver start cc1plus
    kids = marked(os.environ["KILN_CHILD_MARKER"])
    print("NICE", *sorted({os.getpriority(os.PRIO_PROCESS, pid) for pid, _ in kids}))
    """
)


def test_background_build_dies_with_its_process(tmp_path):
    marker = f"kiln-native-child-{uuid.uuid4().hex}"
    env = dict(
        os.environ,
        KILN_NATIVE_DIR=str(tmp_path / "native"),
        KILN_CACHE_DIR=str(tmp_path / "cache"),
        KILN_CHILD_MARKER=marker,
        PYTHONPATH=os.pathsep.join([os.path.abspath(SRC), os.path.dirname(__file__)]),
    )
    env.pop("KILN_NATIVE", None)
    script = tmp_path / "start_build.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), os.path.abspath(SRC)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    left = marked(marker)
    deadline = time.time() + 5
    while left and time.time() < deadline:  # a killed process needs a moment to go
        time.sleep(0.1)
        left = marked(marker)
    for pid, _ in left:  # do not leave them running when the test fails
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    assert not left, f"the native build outlived its process: {left}"
    nice = out.stdout.split("NICE", 1)[1].split()
    assert nice and all(int(n) == 19 for n in nice), out.stdout
    # nothing half-written stays behind either
    assert not [p for p in (tmp_path / "native").glob("*") if p.name.endswith(".tmp")]
