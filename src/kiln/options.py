"""The one place kiln reads configuration: `compile(...)` arguments and environment variables.

Takes the keyword arguments of `kiln.compile` (and the process environment) and gives one frozen
`Options` object that every stage receives. Nothing else in kiln reads `os.environ`; this keeps
configuration explicit and testable (STYLE.md item 6).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# Every option a user may pass in `options={...}`, with its default and type. What each one does
# and where it is read (the audit of issue 29; tests/test_options.py checks every line):
#   triton.cudagraphs        device graphs (backends/builtin.py -> runtime/device_graphs.py); on
#                            CPU tensors the graph runs without one and perf_hints says why
#   triton.emulate_precision_casts  Triton renderer rounds low-precision intermediates as eager
#   trace.enabled, trace.dir the trace (kiln/trace/, read by capture/frontend.py) that
#                            `kiln report DIR` renders
#   max_autotune             no kernel search yet: warns once (NOT_IMPLEMENTED below)
#   epilogue_fusion          no GEMM epilogue fusion yet: False is the truth, True warns once
#   shape_padding            pad large unaligned matmuls on the GPU (codegen/pad_mm.py); False
#                            leaves them as written
#   fallback_random          kiln always draws random numbers with ATen's own generators in
#                            program order (random ops are never lowered), so both values hold
#   freezing                 no parameter freezing yet: warns once
#   cache_size_limit         entries per code object (capture/frontend.py); KILN_CACHE_SIZE_LIMIT
#                            is read once, here, when the options are built
#   debug.verify_ir, debug.fuel  the scheduler's IR verifier and fusion fuel (codegen stages)
#   compile.async            compile in a background thread, calls run eagerly until it is done
#                            (backends/builtin.py -> runtime/async_compile.py)
#   optimize_ddp             a graph captured inside a DistributedDataParallel forward is split
#                            at DDP's bucket boundaries (backends/ddp_split.py); False: one graph
#   enable_shape_handling, shape_handling_configs  pad inputs up to a few sizes ("gears") and
#                            slice outputs back (runtime/shape_handling.py, applied by api.py
#                            around the compiled callable; configs are validated there)
KNOWN_OPTIONS: dict[str, tuple[Any, type | tuple[type, ...]]] = {
    "triton.cudagraphs": (False, bool),
    "triton.emulate_precision_casts": (False, bool),
    "trace.enabled": (False, bool),
    "trace.dir": (None, (str, type(None))),
    "max_autotune": (False, bool),
    "epilogue_fusion": (False, bool),
    "shape_padding": (True, bool),
    "fallback_random": (False, bool),
    "freezing": (False, bool),
    "cache_size_limit": (8, int),
    "warn_eager": (True, bool),
    "debug.verify_ir": (False, bool),
    # the kiln device that compiles graphs (kiln.devices); None: the one registered for the
    # tensors' device type
    "codegen.device": (None, (str, type(None))),
    "debug.fuel": (None, (int, type(None))),
    # No first-call stall: a captured graph compiles in a background thread while its calls
    # run on eager kernels (the captured graph as it is), and the compiled code is swapped in
    # between two calls once it is ready; a training step that started eagerly finishes
    # eagerly. Results are eager's either way; a failed background compile leaves the graph
    # eager and is recorded as a fallback with its reason. kiln.reset() drops queued compiles.
    # Off by default: the first calls are then slower (eager) but no call ever waits.
    "compile.async": (False, bool),
    "optimize_ddp": (True, bool),
    "enable_shape_handling": (False, bool),
    "shape_handling_configs": (None, (list, tuple, type(None))),
}

# Option values kiln accepts but cannot honour yet: each warns once instead of being refused,
# because all three only ask for speed (results are eager's either way) and torch.compile code
# sets them routinely (`mode="max-autotune"` above all), so refusing would break working
# programs for no gain in correctness. A value that would change results is never listed here.
NOT_IMPLEMENTED: dict[tuple[str, Any], str] = {
    ("max_autotune", True): "kiln has no kernel search (autotuning) yet; kernels are compiled "
    "with their default configurations",
    ("epilogue_fusion", True): "kiln does not fuse pointwise epilogues into matmul calls yet; "
    "they run as separate fused kernels",
    ("freezing", True): "kiln does not freeze parameters into constants yet; they stay inputs "
    "(results are eager's, and later changes to the parameters are seen)",
}

# Options no code reads because kiln always does what they ask: random ops are never lowered
# into kiln's kernels (rewrites/cse.py keeps them, autograd/partition.py never recomputes them), so
# random numbers always come from ATen's own generators in program order, as eager's do.
HONOURED_BY_CONSTRUCTION = ("fallback_random",)

# Options only kiln's own code generator reads: a named backend without it would ignore them.
CODEGEN_ONLY = ("triton.cudagraphs", "debug.verify_ir", "debug.fuel", "compile.async")
# kiln's named backends that run no kiln code generator (backends/builtin.py, autograd/backend.py)
EAGER_KERNEL_BACKENDS = (
    "eager",
    "aot_eager",
    "aot_eager_decomp_partition",
    "aot_eager_save_all",
    "cudagraphs",
)

# What each mode switches on; an explicit option that contradicts it is an error.
MODE_OPTIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune": {"max_autotune": True, "triton.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True, "triton.cudagraphs": False},
}


def _env() -> Mapping[str, str]:
    return os.environ


def env_logs() -> str:
    """The `KILN_LOGS` setting, read here so that logs.py does not touch the environment."""
    return _env().get("KILN_LOGS", "")


def env_warn_eager() -> bool:
    """`KILN_WARN_EAGER=0` silences the once-per-function warning that a function runs eagerly
    (an explicit `options={"warn_eager": ...}` wins)."""
    value = _env().get("KILN_WARN_EAGER", "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def env_cache_dir() -> str:
    base = _env().get("KILN_CACHE_DIR")
    if base:
        return base
    xdg = _env().get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "kiln")


def env_artifact_cache() -> bool:
    """Whether compiled graphs are kept on disk for later processes (the warm start,
    backends/warm.py); `KILN_ARTIFACT_CACHE=0` says no (kernels stay cached either way)."""
    value = _env().get("KILN_ARTIFACT_CACHE", "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def env_cache_max_bytes() -> int:
    """The size bound of the kernel cache folder (`KILN_CACHE_MAX_MB`, default 4096): past it
    the least recently used entries are removed (runtime/artifacts.py)."""
    text = _env().get("KILN_CACHE_MAX_MB", "4096").strip()
    try:
        megabytes = float(text)
    except ValueError:
        raise ValueError(
            f"KILN_CACHE_MAX_MB={text!r} is not a number; give the cache's size bound in MB"
        ) from None
    return int(megabytes * 1e6)


def env_native() -> tuple[bool, str]:
    """Whether kiln may build and use its native checks (`KILN_NATIVE=0` says no), and the
    folder they are built into (`KILN_NATIVE_DIR`; by default beside, not inside, the kernel
    cache: they belong to the installed kiln and torch, not to any model, so a cold kernel cache
    does not rebuild them)."""
    enabled = _env().get("KILN_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")
    base = _env().get("KILN_NATIVE_DIR")
    if not base:
        xdg = _env().get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "kiln-native")
    return enabled, base


def _suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


@dataclass(frozen=True)
class Options:
    backend: str | Callable = "inductor"
    mode: str = "default"
    fullgraph: bool = False
    dynamic: bool | None = None
    config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # (once-key, message) warnings `kiln.compile` gives for accepted values not honoured yet
    notices: tuple[tuple[str, str], ...] = ()

    def get(self, name: str) -> Any:
        if name not in KNOWN_OPTIONS:
            raise KeyError(f"kiln has no option {name!r}")
        return self.config.get(name, KNOWN_OPTIONS[name][0])

    @property
    def cache_size_limit(self) -> int:
        return self.get("cache_size_limit")  # KILN_CACHE_SIZE_LIMIT is folded in by build_options

    @property
    def warn_eager(self) -> bool:
        if "warn_eager" in self.config:
            return bool(self.config["warn_eager"])
        return env_warn_eager()


def build_options(
    *,
    backend: str | Callable = "inductor",
    mode: str | None = None,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    options: Mapping[str, Any] | None = None,
    known_backends: tuple[str, ...] = (),
) -> Options:
    """Validate `compile(...)` arguments and return the frozen options; errors name the fix."""
    if isinstance(backend, str):
        if known_backends and backend not in known_backends:
            raise ValueError(
                f"kiln.compile: unknown backend {backend!r}.{_suggest(backend, known_backends)} "
                f"Known backends: {', '.join(sorted(known_backends))}; or pass a callable "
                "backend(gm, example_inputs) -> callable."
            )
    elif not callable(backend):
        raise TypeError(
            f"kiln.compile: backend must be a name or a callable, got {type(backend).__name__}"
        )
    mode = "default" if mode is None else mode
    if mode not in MODES:
        raise ValueError(
            f"kiln.compile: unknown mode {mode!r}.{_suggest(mode, MODES)} "
            f"Valid modes: None, {', '.join(repr(m) for m in MODES)}."
        )
    if dynamic not in (None, True, False):
        raise ValueError(f"kiln.compile: dynamic must be None, True or False, got {dynamic!r}")
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(
            f"kiln.compile: options must be a dict of option names, got {type(options).__name__}"
        )
    config: dict[str, Any] = dict(MODE_OPTIONS[mode])
    for name, value in (options or {}).items():
        if name not in KNOWN_OPTIONS:
            raise ValueError(
                f"kiln.compile: unknown option {name!r}.{_suggest(name, KNOWN_OPTIONS)} "
                f"Known options: {', '.join(sorted(KNOWN_OPTIONS))}."
            )
        expected = KNOWN_OPTIONS[name][1]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise TypeError(
                f"kiln.compile: option {name!r} takes {_type_names(expected)}, got {value!r}"
            )
        if name in MODE_OPTIONS[mode] and MODE_OPTIONS[mode][name] != value:
            raise ValueError(
                f"kiln.compile: mode={mode!r} sets {name}={MODE_OPTIONS[mode][name]!r}, but "
                f"options sets {name}={value!r}. Drop one of them, or use a mode that agrees "
                f"(e.g. {_agreeing_modes(name, value)})."
            )
        config[name] = value
    if "cache_size_limit" not in config:
        config["cache_size_limit"] = _env_cache_size_limit()
    _check_backend_reads(backend, mode, config)
    _check_trace(config)
    if config.get("shape_handling_configs") is not None and not config.get("enable_shape_handling"):
        raise ValueError(
            "kiln.compile: options sets 'shape_handling_configs' but not "
            "'enable_shape_handling', so nothing would be padded. Add "
            "'enable_shape_handling': True (or drop the configs)."
        )
    return Options(
        backend=backend,
        mode=mode,
        fullgraph=bool(fullgraph),
        dynamic=dynamic,
        config=MappingProxyType(config),
        notices=_not_implemented_notices(mode, config),
    )


def _type_names(t) -> str:
    ts = t if isinstance(t, tuple) else (t,)
    return " or ".join("None" if x is type(None) else x.__name__ for x in ts)


def _agreeing_modes(name: str, value: Any) -> str:
    ok = [m for m in MODES if MODE_OPTIONS[m].get(name, KNOWN_OPTIONS[name][0]) == value]
    return ", ".join(repr(m) for m in ok) or "mode=None"


def _env_cache_size_limit() -> int:
    """`KILN_CACHE_SIZE_LIMIT`, read once per `kiln.compile` call (an explicit option wins)."""
    text = _env().get("KILN_CACHE_SIZE_LIMIT", "").strip()
    if not text:
        return KNOWN_OPTIONS["cache_size_limit"][0]
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 1:
        raise ValueError(
            f"kiln: KILN_CACHE_SIZE_LIMIT={text!r} is not a positive whole number of entries; "
            "set it to e.g. 8, or unset it."
        )
    return value


def _check_backend_reads(backend, mode: str, config: Mapping[str, Any]) -> None:
    """A named backend that runs no kiln code generator would silently ignore the code
    generator's options: refuse them (a callable backend may hand the graph to kiln's
    `inductor`, which reads them from the options it is given, so it keeps them)."""
    if not isinstance(backend, str) or backend not in EAGER_KERNEL_BACKENDS:
        return
    for name in CODEGEN_ONLY:
        value = config.get(name, KNOWN_OPTIONS[name][0])
        if backend == "cudagraphs" and name == "triton.cudagraphs" and value:
            continue  # device graphs are what that backend does
        if value != KNOWN_OPTIONS[name][0]:
            via = f"mode={mode!r}" if MODE_OPTIONS[mode].get(name) == value else "options"
            raise ValueError(
                f"kiln.compile: {via} sets {name}={value!r}, which only kiln's code generator "
                f"reads, but backend={backend!r} runs none, so it would do nothing. Use "
                "backend='inductor' (the default), or drop the setting."
            )


def _check_trace(config: dict[str, Any]) -> None:
    """`trace.dir` needs `trace.enabled`; an enabled trace gets an absolute folder now (the
    working directory may change before the first call): `trace.dir`, else `KILN_TRACE_DIR`,
    else `./kiln_trace`."""
    if config.get("trace.dir") is not None and not config.get("trace.enabled"):
        raise ValueError(
            "kiln.compile: options sets 'trace.dir' but not 'trace.enabled', so nothing would "
            "be written there. Add 'trace.enabled': True (or drop 'trace.dir')."
        )
    if config.get("trace.enabled"):
        folder = config.get("trace.dir") or _env().get("KILN_TRACE_DIR") or "kiln_trace"
        config["trace.dir"] = os.path.abspath(folder)


def _not_implemented_notices(mode: str, config: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(once-key, message) for each accepted value kiln cannot honour yet (`NOT_IMPLEMENTED`);
    `kiln.compile` warns each once (this module only describes: it reports nothing itself)."""
    notices = []
    for (name, value), message in NOT_IMPLEMENTED.items():
        if config.get(name, KNOWN_OPTIONS[name][0]) == value:
            if MODE_OPTIONS[mode].get(name) == value:
                acts = "reduce-overhead" if MODE_OPTIONS[mode]["triton.cudagraphs"] else "default"
                message += f"; mode={mode!r} otherwise does what mode={acts!r} does"
                via = f"mode={mode!r}"
            else:
                via = f"{name}={value}"
            notices.append((f"options:{name}:{value}:{mode}", f"kiln: {via}: {message}."))
    return tuple(notices)
