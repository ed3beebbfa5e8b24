#!/usr/bin/env bash
# Set up kiln on a fresh machine and run its main job: compile a model, check it, print the speedup.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0   # pinned first: a bare `torch` pulls CUDA wheels
python3 -m pip install -q -e '.[test]'
python3 -m kiln native || echo "native guard checks not built: guards run in Python"  # ~15 s, once
python3 -m kiln demo "$@"
