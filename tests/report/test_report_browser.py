"""The report page in a real browser: headless Chromium loads the pages of two traces (a
program with graph breaks and recompiles, and the nanoGPT training step), runs their script
with no console errors, shows the frames, breaks and kernels, and takes a screenshot.

Skipped only where no Chromium is installed (CI installs Debian's: `apt-get install -y
chromium`). Set KILN_REPORT_SHOTS=DIR to keep the screenshots.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess

import pytest

from kiln.report import read_trace, write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
)


def chromium(page: str, profile: str, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, f"file://{page}"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def console_errors(stderr: str) -> list[str]:
    """The page's console errors and uncaught exceptions in Chromium's log."""
    return [
        line
        for line in stderr.splitlines()
        if "CONSOLE" in line and re.search(r"Uncaught|Error|error", line)
    ]


def load(page: str, tmp_path, name: str) -> str:
    """Load `page` headless: its DOM after the script ran, with console errors checked, and a
    screenshot of it."""
    done = chromium(page, str(tmp_path / f"profile-{name}"), "--dump-dom")
    assert console_errors(done.stderr) == []
    dom = done.stdout
    assert 'id="kiln-js-error"' not in dom
    assert re.search(r"<body[^>]*data-ready=\"1\"", dom), dom[:500]
    shot = tmp_path / f"{name}.png"
    chromium(
        page,
        str(tmp_path / f"profile-{name}-shot"),
        f"--screenshot={shot}",
        "--window-size=1280,1600",
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    keep = os.environ.get("KILN_REPORT_SHOTS")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(shot, os.path.join(keep, shot.name))
    return dom


def check_content(folder: str, dom: str) -> None:
    tr = read_trace(folder)
    assert tr.frames
    for fr in tr.frames:  # every frame has its section
        assert f'data-label="{html.escape(fr.label, quote=False)}"' in dom, fr.label
    for fr in tr.frames:
        for b in fr.breaks:
            assert html.escape(b["reason"], quote=False) in dom
    names = [k["name"] for f in tr.frames for g in f.kernels for k in g["kernels"]]
    assert names
    shown = set(re.findall(r'<summary class="kernel-name">([^<]*)</summary>', dom))
    assert set(names) <= shown


def test_breaks_and_recompiles_page_in_chromium(breaks_trace, tmp_path):
    dom = load(write_report(breaks_trace), tmp_path, "breaks")
    check_content(breaks_trace, dom)
    assert "graph-break" in dom and "recompile" in dom


def test_nanogpt_training_page_in_chromium(nanogpt_trace, tmp_path):
    dom = load(write_report(nanogpt_trace), tmp_path, "nanogpt")
    check_content(nanogpt_trace, dom)
    assert "AOT forward / backward graphs" in dom


def test_a_script_error_is_caught(tmp_path):
    """The checks above can fail: a page whose script throws is caught by them."""
    page = tmp_path / "broken.html"
    page.write_text(
        "<!doctype html><html><head><script>window.onerror=function(m){var d="
        "document.createElement('div');d.id='kiln-js-error';document.body.appendChild(d)};"
        "</script></head><body><script>undefinedFunction();</script></body></html>"
    )
    done = chromium(str(page), str(tmp_path / "profile"), "--dump-dom")
    assert 'id="kiln-js-error"' in done.stdout
    assert console_errors(done.stderr)
