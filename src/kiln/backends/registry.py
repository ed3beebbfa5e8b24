"""The backend registry: names to compiler callables, with the torch.compile contract.

A backend is `backend(gm: torch.fx.GraphModule, example_inputs: list) -> callable`. Built-in
backends register lazily (their modules import only when first looked up) so that
`import kiln` stays cheap.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Callable, TypeVar, overload

CompilerFn = Callable
F = TypeVar("F", bound=Callable)

_backends: dict[str, CompilerFn] = {}
_lazy: dict[str, str] = {}  # name -> "module:attr", imported on first lookup
_tags: dict[str, tuple[str, ...]] = {}


@overload
def register_backend(
    compiler_fn: None = None, name: str | None = None, tags: tuple[str, ...] = ()
) -> Callable[[F], F]: ...


@overload
def register_backend(compiler_fn: F, name: str | None = None, tags: tuple[str, ...] = ()) -> F: ...


def register_backend(
    compiler_fn: Callable | None = None, name: str | None = None, tags: tuple[str, ...] = ()
) -> Callable:
    """Register a backend; usable as `register_backend(fn)` or `@register_backend(name=...)`."""
    if compiler_fn is None:
        return lambda fn: register_backend(fn, name=name, tags=tags)
    if not callable(compiler_fn):
        raise TypeError(f"register_backend: {compiler_fn!r} is not callable")
    key = name or compiler_fn.__name__
    if key in _backends or key in _lazy:
        raise ValueError(f"register_backend: a backend named {key!r} is already registered")
    _backends[key] = compiler_fn
    _tags[key] = tuple(tags)
    return compiler_fn


def register_lazy(name: str, target: str, tags: tuple[str, ...] = ()) -> None:
    _lazy[name] = target
    _tags[name] = tuple(tags)


def list_backends(exclude_tags: tuple[str, ...] | None = ("debug", "experimental")) -> list[str]:
    names = set(_backends) | set(_lazy)
    excluded = set(exclude_tags or ())
    return sorted(n for n in names if not excluded & set(_tags.get(n, ())))


def known_backend_names() -> tuple[str, ...]:
    return tuple(sorted(set(_backends) | set(_lazy)))


def lookup_backend(backend: str | CompilerFn) -> CompilerFn:
    if callable(backend):
        return backend
    if backend in _backends:
        return _backends[backend]
    if backend in _lazy:
        module, attr = _lazy[backend].split(":")
        fn = getattr(importlib.import_module(module), attr)
        _backends[backend] = fn
        del _lazy[backend]
        return fn
    close = difflib.get_close_matches(backend, known_backend_names(), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"unknown backend {backend!r}.{hint} Known: {', '.join(known_backend_names())}"
    )
