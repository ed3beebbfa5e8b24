"""kiln's version, in its own module: caches key on it; no stage imports the package root.

`source_digest()` names the exact code running: a hash of every `.py` file of the installed
package. The compiled-artifact cache keys on it rather than on `__version__`, which stays the
same while the code changes (a checkout, an edit), so a graph compiled by other code is never
loaded; two machines with the same kiln get the same digest, so a shipped cache
(`kiln.save_cache_artifacts`) carries over.
"""

from __future__ import annotations

import functools
import hashlib
import os

__version__ = "0.1.0"


@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    root = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256(__version__.encode())
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                data = f.read()
            digest.update(os.path.relpath(path, root).encode() + b"\0" + data + b"\0")
    return digest.hexdigest()
