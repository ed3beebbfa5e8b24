"""A Triton compile worker: a standalone script that `triton_workers.py` starts as a process.

Reads one JSON job per line on stdin — `{"path", "kernel", "dtypes", "grid", "constexprs",
"num_warps"}` — imports the kernel module at `path`, compiles that kernel for the current device
with `JITFunction.warmup` (which fills Triton's on-disk cache) and answers one JSON line on
stdout: `{"kernel": ..., "ok": true}` or `{"kernel": ..., "ok": false, "error": "..."}`. It
exits when stdin closes.

Why a script and not `multiprocessing`: a spawned multiprocessing child re-imports the parent's
`__main__`, so a user script without an `if __name__ == "__main__":` guard would run again in
every worker (model building, training, all of it). This file imports only torch, Triton and
the kernel module; it never imports kiln or the user's code.
"""

import importlib.util
import json
import os
import sys


def _load(path: str):
    name = "kiln_triton_" + os.path.basename(path).split(".")[0][:24]
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # Triton resolves a kernel's globals through its module
        spec.loader.exec_module(module)
    return module


def _compile(job: dict) -> None:
    import torch

    fn = getattr(_load(job["path"]), job["kernel"])
    dtypes = [getattr(torch, d) for d in job["dtypes"]]
    fn.warmup(*dtypes, grid=tuple(job["grid"]), num_warps=job["num_warps"], **job["constexprs"])


def main() -> int:
    import torch  # noqa: F401 - imported before the first job so that jobs start fast
    import triton  # noqa: F401

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        try:
            _compile(job)
            reply = {"kernel": job["kernel"], "ok": True}
        except Exception as e:  # reported to the parent, which compiles the kernel itself
            reply = {"kernel": job["kernel"], "ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
