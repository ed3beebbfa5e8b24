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

# Every option a user may pass in `options={...}`, with its default and type.
KNOWN_OPTIONS: dict[str, tuple[Any, type | tuple[type, ...]]] = {
    "triton.cudagraphs": (False, bool),
    "triton.emulate_precision_casts": (False, bool),
    "trace.enabled": (False, bool),
    "trace.dir": (None, (str, type(None))),
    "max_autotune": (False, bool),
    "epilogue_fusion": (True, bool),
    "shape_padding": (False, bool),
    "fallback_random": (False, bool),
    "freezing": (False, bool),
    "cache_size_limit": (8, int),
    "debug.verify_ir": (False, bool),
    "debug.fuel": (None, (int, type(None))),
}

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


def env_cache_dir() -> str:
    base = _env().get("KILN_CACHE_DIR")
    if base:
        return base
    xdg = _env().get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "kiln")


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

    def get(self, name: str) -> Any:
        if name not in KNOWN_OPTIONS:
            raise KeyError(f"kiln has no option {name!r}")
        return self.config.get(name, KNOWN_OPTIONS[name][0])

    @property
    def cache_size_limit(self) -> int:
        env = _env().get("KILN_CACHE_SIZE_LIMIT")
        return (
            int(env)
            if env and "cache_size_limit" not in self.config
            else self.get("cache_size_limit")
        )


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
    return Options(
        backend=backend,
        mode=mode,
        fullgraph=bool(fullgraph),
        dynamic=dynamic,
        config=MappingProxyType(config),
    )


def _type_names(t) -> str:
    ts = t if isinstance(t, tuple) else (t,)
    return " or ".join("None" if x is type(None) else x.__name__ for x in ts)


def _agreeing_modes(name: str, value: Any) -> str:
    ok = [m for m in MODES if MODE_OPTIONS[m].get(name, KNOWN_OPTIONS[name][0]) == value]
    return ", ".join(repr(m) for m in ok) or "mode=None"
