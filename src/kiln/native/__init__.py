"""Native checks: guard tables and tensor addresses read in C++, built once per machine.

Takes `native_checks.cpp`; gives `table(kind, rows, names, python_check)`, a `Table` whose
`check()` says whether every row of held facts still holds, `tensor_spec(spec, python_check)`,
one whose `check(x)` says whether a tensor fetched on the call has a guard's facts,
`data_ptrs(tensors)`, the addresses of a sequence of tensors, and `as_strided()`, the view
maker compiled wrappers call.
The same module carries `launch`, the generic Triton kernel launch of `native_launch.cpp`
(used by triton_native_launcher.py; no Python twin: without it Triton's own launchers run).
The checks exist in Python too and give the same answers; the C++ versions are an order of
magnitude faster on the tables a large model checks on every call (ResNet-50's entry checks 267
parameters and buffers, ~460 attribute constants and ~150 modules; a device graph reads the
address of every parameter). torch.compile runs its guards
in C++; without this, kiln's call overhead on such models is several times torch.compile's.

Built with the system C++ compiler against the installed torch's headers, on first use, in a
background thread (10-20 s of one core), into `KILN_NATIVE_DIR` (options.env_native), keyed by
the source, compiler, torch and Python; a later process loads it in a millisecond. Until it
loads, and for good where it cannot be built (no compiler, not Linux, `KILN_NATIVE=0`), tables
run their Python loops: the same facts, checked more slowly. A failed build is said once in
`KILN_LOGS=perf_hints`. `wait()` (and `kiln native`) builds and loads it in the foreground.

The background build must neither outlive its process nor compete with the user's work. Lazy
building stays (a fresh environment gets fast guards without a setup step), but the compiler
runs at the lowest CPU priority (nice 19: it gets a core only when the user's work leaves one
idle) in a process group of its own, which an exit handler kills with all its children (the
driver does not stop `cc1plus` when it is itself killed). Setup steps and CI images build it in
the foreground once with `kiln native`; `kiln doctor` says which path a process takes.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import operator
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import weakref
from typing import Any, Callable

import torch

from .. import logs, options

SOURCE = os.path.join(os.path.dirname(__file__), "native_checks.cpp")
# the generic Triton kernel launch (triton_native_launcher.py), built into the same module
SOURCES = (SOURCE, os.path.join(os.path.dirname(__file__), "native_launch.cpp"))
KINDS = ("tensors", "items", "dicts", "empty", "spec")

_lock = threading.Lock()
_done = threading.Event()
_state: dict[str, Any] = {"status": "idle", "module": None, "error": "", "path": ""}
_waiting: weakref.WeakSet[Table] = weakref.WeakSet()


class Table:
    """One table of held facts. `check()` is the Python loop until the native module loads,
    then the native check of the same rows (`native_rows`, in the layout `prepare` takes)."""

    __slots__ = ("kind", "native_rows", "names", "python", "check", "__weakref__")

    def __init__(self, kind: str, native_rows: tuple, names: tuple, python_check: Callable):
        assert kind in KINDS, kind
        self.kind, self.native_rows, self.names = kind, native_rows, names
        self.python = python_check  # kept: the same answer, for tests and a reader
        self.check: Callable[[], bool] = python_check

    @property
    def is_native(self) -> bool:
        return type(self.check).__name__ == "builtin_function_or_method"

    def _upgrade(self, module: Any) -> None:
        try:
            if self.kind == "spec":  # one fetched tensor's facts: `check(tensor)`
                self.check = module.prepare_spec(self.native_rows)
            else:
                self.check = module.prepare(self.kind, self.native_rows, self.names)
        except (ValueError, TypeError) as e:  # rows of an unexpected shape: keep the Python loop
            logs.once(
                f"native:rows:{self.kind}",
                "perf_hints",
                f"native checks: a {self.kind} table stays in Python ({e})",
            )


def table(kind: str, native_rows: tuple, names: tuple, python_check: Callable) -> Table:
    t = Table(kind, native_rows, names, python_check)
    module = start()
    if module is not None:
        t._upgrade(module)
    else:
        with _lock:
            if _state["module"] is not None:
                t._upgrade(_state["module"])
            elif _state["status"] == "building":
                _waiting.add(t)
    return t


_specs: weakref.WeakValueDictionary[tuple, Table] = weakref.WeakValueDictionary()


def tensor_spec(spec: tuple, python_check: Callable[[Any], bool]) -> Table:
    """A `Table` whose `check(x)` says whether tensor `x` has `spec`, (type, dtype, device,
    sizes, strides, requires_grad), the type torch.Tensor or Parameter exactly: `python_check`
    until the native module loads, its C++ twin after (a guard on a tensor read through a
    list or dict on every call, such as an optimizer's state: ~1 us of attribute reads in
    Python, a tenth of that in C++). Equal specs share one table."""
    table_ = _specs.get(spec)
    if table_ is None:
        table_ = _specs[spec] = table("spec", spec, (), python_check)
    return table_


def _python_data_ptrs(tensors) -> tuple:
    return tuple(map(_DATA_PTR, tensors))


_DATA_PTR = operator.methodcaller("data_ptr")
data_ptrs: Callable[[Any], tuple] = _python_data_ptrs  # the native one once loaded


def as_strided() -> Callable:
    """`torch.as_strided`, or the native one (the same call without Python's argument parsing,
    ~2 us less a view on the H200 host) once the module is loaded: compiled wrappers take it
    when they are built, and `upgrade_as_strided` swaps it in later for those built before."""
    module = start()
    return module.as_strided if module is not None else torch.as_strided


def upgrade_as_strided(call: Callable) -> None:
    """A compiled wrapper `call` whose global `_as_strided` is `torch.as_strided` (it was built
    while the module was still being built: a fresh machine's first compiles, which took a
    served GPT-2's dynamic entry there) calls the native one once the module loads. Held
    weakly; nothing happens if it is already native or the module never loads."""
    if call.__globals__.get("_as_strided") is not torch.as_strided:
        return
    ref = weakref.ref(call)

    def upgrade(module: Any) -> None:
        fn = ref()
        if fn is not None and fn.__globals__.get("_as_strided") is torch.as_strided:
            fn.__globals__["_as_strided"] = module.as_strided

    with _lock:
        if _state["module"] is None and _state["status"] in ("idle", "building"):
            _later.append(upgrade)
            return
    if _state["module"] is not None:
        upgrade(_state["module"])


_later: list[Callable[[Any], None]] = []  # run with the module once it loads (`_loaded`)


def status() -> tuple[str, str]:
    """("idle" | "building" | "ready" | "failed" | "off", why it failed or is off)."""
    return _state["status"], _state["error"]


def start(background: bool = True) -> Any:
    """The native module if it is loaded (loading a built one now); otherwise start building
    it, once, in a thread (its compiler at nice 19 when `background`), and give None."""
    if _state["module"] is not None or _state["status"] != "idle":
        return _state["module"]
    with _lock:
        if _state["status"] != "idle":
            return _state["module"]
        path = _load_built()
        if path is None or _state["module"] is not None:
            return _state["module"]
        _state["status"] = "building"
        _state["path"] = path
        threading.Thread(target=_build_and_load, args=(path, background), daemon=True).start()
    logs.once(
        "native:building",
        "perf_hints",
        "native checks: building kiln's native guard checks in the background (once per "
        "machine, compiler, torch and Python; about 15 s); guards run in Python until then",
    )
    return None


def _load_built() -> str | None:
    """With `_lock` held: load the module if it is built; give the path it is (or will be)
    built at, or None when it cannot be (the status says why)."""
    enabled, folder = options.env_native()
    why = "KILN_NATIVE=0" if not enabled else _unsupported()
    if why:
        _finish("off", why)
        return None
    try:
        path = os.path.join(folder, f"kiln_native_{_key()}{_suffix()}")
    except Exception as e:  # no compiler
        _fail(str(e))
        return None
    _state["path"] = path
    if os.path.exists(path):
        try:
            _loaded(_load(path))
        except Exception as e:  # a damaged file: build it again
            _state["error"] = f"reloading {path} failed ({e})"
            _remove(path)
    return path


def probe() -> tuple[str, str]:
    """Load the module if it is already built, without starting a build; gives `status()`
    ("idle" then means: not built yet, guards run in Python until a build finishes)."""
    if _state["module"] is None and _state["status"] == "idle":
        with _lock:
            if _state["status"] == "idle":
                _load_built()
    return status()


def wait(timeout: float | None = None) -> bool:
    """Build (if needed, at normal priority: the caller asked for it) and load the native
    module; True when it is loaded."""
    start(background=False)
    if _state["status"] == "building":
        _done.wait(timeout)
    return _state["module"] is not None


def _unsupported() -> str:
    if sys.platform != "linux":
        return f"native checks are built on Linux only (this is {sys.platform})"
    return ""


def _build_and_load(path: str, background: bool = True) -> None:
    try:
        _build(path, background)
        module = _load(path)
    except Exception as e:
        with _lock:
            _fail(str(e))
        return
    with _lock:
        _loaded(module)


def _fail(why: str) -> None:
    _finish("failed", why)
    logs.once(
        "native:failed",
        "perf_hints",
        "native checks: could not build them, so guards stay in Python (slower calls on large "
        f"models): {why[:2000]}",
    )


def _loaded(module: Any) -> None:
    """Called with `_lock` held: publish the module and move waiting tables onto it."""
    global data_ptrs
    _state["module"] = module
    data_ptrs = module.data_ptrs
    for t in list(_waiting):
        t._upgrade(module)
    _waiting.clear()
    for upgrade in _later:
        upgrade(module)
    _later.clear()
    _finish("ready", "")


def _finish(status: str, error: str) -> None:
    _state["status"], _state["error"] = status, error
    if status != "ready":  # it will not load: nothing waits for it
        _later.clear()
    _done.set()


def _torch_dirs() -> tuple[list[str], str]:
    root = os.path.dirname(torch.__file__)
    include = os.path.join(root, "include")
    py_include = sysconfig.get_paths()["include"]
    return [include, os.path.join(include, "torch", "csrc", "api", "include"), py_include], (
        os.path.join(root, "lib")
    )


def _command(std: str, out: str) -> list[str]:
    from .compiler import find_compiler

    compiler, _ = find_compiler()
    includes, lib = _torch_dirs()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        compiler,
        "-O2",
        "-shared",
        "-fPIC",
        f"-std={std}",
        "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-I{d}" for d in includes),
        *SOURCES,
        "-o",
        out,
        f"-L{lib}",
        "-ltorch_python",
        "-ltorch_cpu",
        "-lc10",
        f"-Wl,-rpath,{lib}",
    ]


def _key() -> str:
    from .compiler import find_compiler

    source = b""
    for name in SOURCES:
        with open(name, "rb") as f:
            source += f.read() + b"\0"
    parts = [*find_compiler(), torch.__version__, torch.__file__, sys.version, _suffix()]
    return hashlib.sha256(source + "\0".join(parts).encode()).hexdigest()[:20]


def _suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def _build(path: str, background: bool = True) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    errors = []
    try:
        for std in ("c++20", "c++17"):  # newer torch headers want C++20; older compilers lack it
            code, stderr = _run_compiler(_command(std, tmp), tmp, background)
            if code == 0:
                os.replace(tmp, path)  # atomic: another process never loads half a file
                return
            errors.append(f"-std={std}: {stderr.strip()[-1500:]}")
    finally:
        _remove(tmp)
    raise RuntimeError("the C++ compile failed:\n" + "\n".join(errors))


# compiler process groups still running, with the file each writes: the exit handler kills them
_children: dict[int, str] = {}
_exiting = False


def _run_compiler(command: list[str], tmp: str, background: bool) -> tuple[int, str]:
    """Run the compiler in a process group of its own (nice 19 when in the background) that
    `_kill_children` ends at exit; gives (exit code, stderr)."""
    nice = shutil.which("nice") if background else None
    with _lock:
        if _exiting:
            raise RuntimeError("the process is exiting")
        proc = subprocess.Popen(
            [nice, "-n", "19", *command] if nice else command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            process_group=0,
        )
        _children[proc.pid] = tmp
    if background and not nice:
        try:  # no `nice` program: lower the driver at least (children it started keep 0)
            os.setpriority(os.PRIO_PROCESS, proc.pid, 19)
        except OSError:
            pass
    try:
        _, stderr = proc.communicate()
    finally:
        with _lock:
            _children.pop(proc.pid, None)
    return proc.returncode, stderr


@atexit.register
def _kill_children() -> None:
    """At exit: end every compiler process group this process started, and their files."""
    global _exiting
    with _lock:
        _exiting = True
        children = dict(_children)
    for pgid, tmp in children.items():
        try:
            os.killpg(pgid, signal.SIGKILL)  # the whole group: driver, cc1plus, as, ld
        except OSError:
            pass
        _remove(tmp)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("kiln_native", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    """`kiln native`: build and load the native checks now; say where they are, or why not.
    `kiln native --status` only says which path this process would take (as `kiln doctor`)."""
    if argv and argv[0] == "--status":
        print(f"native checks: {describe(probe())}")
        return 0
    t0 = time.perf_counter()
    ok = wait()
    status_, why = status()
    if ok:
        module = _state["module"]
        print(
            f"kiln native checks: {status_}, {module.__file__} ({time.perf_counter() - t0:.1f} s)"
        )
        return 0
    print(f"kiln native checks: {status_}: {why}", file=sys.stderr)
    return 0 if status_ == "off" else 1


def describe(state: tuple[str, str]) -> str:
    """One line a person can act on for a `status()` answer."""
    status_, why = state
    if status_ == "ready":
        return f"native (C++) guard checks loaded from {_state['module'].__file__}"
    if status_ == "off":
        return f"off, guards run in Python: {why}"
    if status_ == "failed":
        return f"Python fallback: the build failed: {why[:600]}"
    where = _state["path"] or "KILN_NATIVE_DIR"
    if status_ == "building":
        return f"building into {where} (nice 19); guards run in Python until it loads"
    return (
        f"not built yet ({where}): a process builds it in the background (nice 19) on first "
        "use and runs guards in Python until then; `kiln native` builds it now"
    )
