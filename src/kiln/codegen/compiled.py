"""`CompiledGraph`, the callable the pipeline gives; `eager_callable`, a graph on eager kernels.

Takes what the pipeline's build pass made (the wrapper's `call`), the schedule and both sources;
gives a callable object that keeps them for inspection (tests assert on `.kernel_source`
— `.cpp_source` / `.triton_source` by language — `.wrapper_source` and `.schedule`), and the
build as data (`.loadable`, devices.Loadable) that the compiled-artifact cache keeps. A graph
loaded from that cache (backends/warm.py) has no schedule.

Why it exists: one result type for every device; a build whose kernels are still compiling in
the background hands over a `FirstCall`, and the compiled graph swaps in the plain call after
the first one has waited for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from .. import pycode

if TYPE_CHECKING:  # not imported at run time: a graph loaded from the cache has no schedule
    from ..devices import Loadable
    from ..schedule import Schedule


WRAPPER_FILE = "<kiln wrapper>"  # the file name of every device's wrapper program


def wrapper_code(data: Any) -> Any:
    """The code object of a build's wrapper program (`data`: the build as data, a
    `Loadable`'s): the one the artifact cache kept beside its source (`wrapper_code`,
    backends/warm.py), or its source compiled."""
    return pycode.load(data.get("wrapper_code"), data["wrapper"], WRAPPER_FILE)


@dataclass(frozen=True)
class FirstCall:
    """A built `call` whose first run must wait for `finish()` (kernels still compiling)."""

    finish: Callable[[], None]
    call: Callable


class CompiledGraph:
    def __init__(
        self,
        fn: Callable[[list], tuple] | FirstCall,
        sched: Schedule | None,
        kernel_source: str,
        wrapper_source: str,
        seconds: float,
        device: str = "cpu",
        kernel_language: str = "C++",
        loadable: Loadable | None = None,
        kernel_count: int | None = None,
    ) -> None:
        self._pending: FirstCall | None = None
        if isinstance(fn, FirstCall):
            from ..runtime.async_compile import defer_finish

            self._pending = fn
            # a background compile finishes the kernels before its swap (async_compile.py)
            self._fn = fn.call if defer_finish(self) else self._first(fn)
        else:
            self._fn = fn
        self.schedule = sched  # None for a graph loaded from the compiled-artifact cache
        # the build as data, which the compiled-artifact cache keeps (None: not cacheable)
        self.loadable = loadable
        self._kernel_count = len(sched.kernels) if sched is not None else (kernel_count or 0)
        self.kernel_source = kernel_source
        self.wrapper_source = wrapper_source
        self.compile_seconds = seconds
        self.device = device
        self.kernel_language = kernel_language

    _boxed_call = True  # the wrapper takes one list of inputs and empties it

    def _first(self, pending: FirstCall) -> Callable[[list], tuple]:
        def first(args: list) -> tuple:
            self.finish()
            self._fn = pending.call
            return pending.call(args)

        return first

    def finish(self) -> None:
        """Wait for kernels still compiling (nothing when none are)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.finish()

    def __call__(self, *args: Any) -> tuple:
        """`compiled([x, y])` (boxed: the list is emptied, so inputs die inside the graph)
        or `compiled(x, y)`."""
        if len(args) == 1 and type(args[0]) is list:
            return self._fn(args[0])
        return self._fn(list(args))

    @property
    def cpp_source(self) -> str:
        return self._source("C++")

    @property
    def triton_source(self) -> str:
        return self._source("Triton")

    def _source(self, language: str) -> str:
        if self.kernel_language != language:
            raise AttributeError(f"this graph's kernels are {self.kernel_language}, not {language}")
        return self.kernel_source

    @property
    def kernel_count(self) -> int:
        return self._kernel_count

    def __repr__(self) -> str:
        return (
            f"<kiln CompiledGraph ({self.device}, {self.kernel_language}): {self.kernel_count} "
            f"kernels, compiled in {self.compile_seconds:.3f}s>"
        )


def eager_callable(gm: torch.fx.GraphModule) -> Callable[..., tuple]:
    """The graph on eager ATen kernels, with the compiled callables' flat-tuple contract: what
    a caller runs when the pipeline declines a graph."""

    def run(*args: Any) -> tuple:
        out = gm(*args)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)

    return run
