#!/usr/bin/env bash
# Type-check kiln's typed core with mypy (what .ci/run calls). The module list and the flags live
# in pyproject.toml's [tool.mypy]; the cache (.mypy_cache, git-ignored) makes reruns take seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! python3 -m mypy --version >/dev/null 2>&1; then
    python3 -m pip install -q mypy==2.4.1 || exit 1  # the version the gate was made green with
fi
python3 -m mypy "$@"
