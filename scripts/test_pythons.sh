#!/usr/bin/env bash
# Run tests/capture on the other Python versions kiln supports (3.11 is the main suite's).
#
# For each version it makes a venv under .venvs/ (ignored by git; reused while its stamp still
# names the same packages), installs torch and the test dependencies there, and runs
# tests/capture with PYTHONPATH=src (no install of kiln itself, so nothing is built).
# Extra arguments go to pytest. Exits non-zero when any version fails or cannot be set up.
#   KILN_PYTHONS="3.12.1 3.13.0"   versions under $(pyenv root)/versions/
#   KILN_TORCH="torch==2.13.0"     the torch requirement (CI's pin)
#   KILN_PYTHONS_DISPOSABLE=1      remove each venv once its tests ran (CI: a clean clone never
#                                  reuses them, and two CUDA-build torch installs of 4.7 GB each
#                                  plus pip's unpacking do not fit a small disk together)
set -uo pipefail
cd "$(dirname "$0")/.."

versions=${KILN_PYTHONS:-"3.12.1 3.13.0"}
torch_req=${KILN_TORCH:-"torch==2.13.0"}
# transformers: tests/capture/test_hf_models.py skips without it, and must run on every version
packages="$torch_req pytest expecttest sympy transformers"
pyenv_root=${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}

free_gib() { df -Pk . | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }

failed=()
for v in $versions; do
    short=${v%.*}
    base="$pyenv_root/versions/$v/bin/python3"
    venv=".venvs/py$short"
    start=$SECONDS
    echo "=== Python $v: $venv"
    if [ ! -x "$base" ]; then
        echo "Python $v not found at $base (install it with: pyenv install $v)"
        failed+=("$v (no interpreter)")
        continue
    fi
    if [ "$(cat "$venv/.kiln-stamp" 2>/dev/null)" != "$v $packages" ]; then
        rm -rf "$venv"
        echo "free disk before setup: $(free_gib) GiB (a torch install needs about 10 GiB while pip unpacks it)"
        # pinned torch first: a bare `torch` would resolve to the newest release
        if ! { "$base" -m venv "$venv" && "$venv/bin/python" -m pip install -q --no-cache-dir $packages; }; then
            echo "could not set up $venv (free disk now: $(free_gib) GiB)"
            rm -rf "$venv"
            failed+=("$v (setup)")
            continue
        fi
        echo "$v $packages" >"$venv/.kiln-stamp"
        echo "set up in $((SECONDS - start)) s"
    fi
    PYTHONPATH=src "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/capture "$@"
    rc=$?
    if [ "$rc" -eq 5 ]; then
        # nothing collected: fine when the caller's own arguments selected nothing, a fault if not
        echo "pytest collected no tests on Python $v"
        [ "$#" -gt 0 ] && rc=0
    fi
    [ "$rc" -ne 0 ] && failed+=("$v (pytest exit $rc)")
    echo "=== Python $v: exit $rc in $((SECONDS - start)) s"
    if [ "${KILN_PYTHONS_DISPOSABLE:-0}" = 1 ]; then
        rm -rf "$venv"
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "tests/capture failed on: ${failed[*]}"
    exit 1
fi
echo "tests/capture passed on Python $versions"
