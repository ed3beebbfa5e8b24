"""Compiling in the background: `options={"compile.async": True}`.

Takes a captured graph's eager callable and a thunk that compiles it (the backend's own
synchronous compile); gives an `AsyncGraph`, a callable that runs the eager callable until the
compile has finished in a background thread, then runs the compiled callable. The first call
of a frame never waits for the compiler: capture's trace gives its results, and the calls that
come while kernels compile run the captured graph on eager kernels.

Rules that keep results eager's, whichever side runs a call:
- The swap happens between calls, on the caller's thread: a call that started eagerly finishes
  eagerly. In training the forward records autograd's graph as it runs, so a step whose forward
  ran eagerly runs its backward eagerly, and one whose forward ran compiled runs the compiled
  backward: the two are never mixed.
- The eager side runs a copy of the captured graph (`eager_copy`), because AOT autograd
  rewrites the captured graph in place while the background thread compiles it.
- The background thread runs under the caller's grad mode, inference mode and autocast state
  (all thread-local in PyTorch), so it compiles what the synchronous compile would have.
- A compile that raises leaves the graph eager for good and records a fallback with the
  reason (`on_error`); the backend's own fallbacks (code generation declined or failed, AOT
  autograd refused) are recorded by the backend as usual and what it returns is swapped in.
- One compile at a time (`compile_lock`, which synchronous compiles take too): kiln's builders
  and caches are written for one compiling thread, and on a small machine two compiles would
  fight over the same cores. The thread exits when its queue is empty, `kiln.reset()` drops
  what is queued and waits for the compile in progress (`cancel_all`), and at interpreter exit
  the queue is dropped and the compile in progress is waited for, so no thread outlives its
  process's work and no compiler is killed half-way.
- Kernels that a build leaves compiling (a `FirstCall`, Triton on CUDA) are finished in the
  background thread before the swap: the caller's first compiled call does not wait.

`STATS` counts compiles started, swaps, failures, eager calls and cancelled compiles; `wait()`
blocks until every queued compile has finished (benchmarks time compiled code, not eager).
"""

from __future__ import annotations

import atexit
import collections
import threading
from typing import Any, Callable

import torch

STATS = {"started": 0, "swapped": 0, "failed": 0, "eager_calls": 0, "cancelled": 0}

# held by whichever thread compiles a graph (background or synchronous): see the module doc
compile_lock = threading.RLock()

_queue: collections.deque[AsyncGraph] = collections.deque()
_cond = threading.Condition()
_worker: threading.Thread | None = None
_running: AsyncGraph | None = None
_local = threading.local()


class AsyncGraph:
    """A graph that runs `eager` until `compile_fn()` has given its compiled callable."""

    __slots__ = ("label", "_eager", "_compile_fn", "_on_error", "_state", "_compiled", "_result")

    def __init__(
        self,
        label: str,
        eager: Callable,
        compile_fn: Callable[[], Callable],
        on_error: Callable[[str], None],
        thread_state: Callable[[], Any],
    ) -> None:
        self.label = label
        self._eager = eager
        self._compile_fn = (compile_fn, thread_state)
        self._on_error = on_error
        self._state = "queued"  # queued, compiling, done, failed, cancelled
        self._compiled: Callable | None = None  # set on the caller's thread: the swap
        self._result: Callable | None = None  # set by the background thread

    def __call__(self, *args: Any) -> Any:
        compiled = self._compiled
        if compiled is not None:
            return compiled(*args)
        if self._state == "done":  # finished since the last call: swap between calls
            self._compiled = compiled = self._result
            STATS["swapped"] += 1
            return compiled(*args)  # type: ignore[misc]
        STATS["eager_calls"] += 1
        return self._eager(*args)

    @property
    def state(self) -> str:
        """ "queued", "compiling", "done" (swapped in on the next call), "failed" (eager for
        good, a fallback recorded) or "cancelled" (kiln.reset() dropped it)."""
        return self._state

    @property
    def compiled(self) -> bool:
        """Whether calls now run the compiled callable."""
        return self._compiled is not None

    def _run(self) -> None:
        compile_fn, thread_state = self._compile_fn
        self._compile_fn = None  # type: ignore[assignment]  # frees the example inputs after
        _local.pending = pending = []
        try:
            with compile_lock, thread_state():
                result = compile_fn()
                for graph in pending:  # kernels still compiling: finish here, not in a call
                    graph.finish()
        except BaseException as e:  # a background compile must cost speed, never the answer
            STATS["failed"] += 1
            self._state = "failed"
            try:
                self._on_error(f"{type(e).__name__}: {e}")
            except Exception:
                pass
            return
        finally:
            _local.pending = None
        self._result = result
        self._state = "done"


def defer_finish(graph: Any) -> bool:
    """Called by a compiled graph whose kernels are still compiling (it has `finish()`): in a
    background compile, its finish runs in the background before the swap (True); otherwise
    (False) its first call waits, as before."""
    pending = getattr(_local, "pending", None)
    if pending is None:
        return False
    pending.append(graph)
    return True


def start(
    label: str, eager: Callable, compile_fn: Callable[[], Callable], on_error: Callable[[str], None]
) -> AsyncGraph:
    """Queue `compile_fn` for the background thread; calls run `eager` meanwhile."""
    graph = AsyncGraph(label, eager, compile_fn, on_error, _caller_state())
    STATS["started"] += 1
    global _worker
    with _cond:
        _queue.append(graph)
        if _worker is None:
            _worker = threading.Thread(target=_work, name="kiln-async-compile", daemon=True)
            _worker.start()
    return graph


def _work() -> None:
    global _worker, _running
    while True:
        with _cond:
            if not _queue:
                _worker = None
                _running = None
                _cond.notify_all()
                return
            graph = _running = _queue.popleft()
            graph._state = "compiling"
        graph._run()
        with _cond:
            _running = None
            _cond.notify_all()


def wait(timeout: float | None = None) -> bool:
    """Block until no compile is queued or running (True), or `timeout` seconds (False)."""
    with _cond:
        return _cond.wait_for(lambda: _worker is None, timeout)


def cancel_all() -> None:
    """Drop the queued compiles and wait for the one in progress (kiln.reset(), exit)."""
    with _cond:
        while _queue:
            _queue.popleft()._state = "cancelled"
            STATS["cancelled"] += 1
        worker = _worker
    wait()
    if worker is not None and worker is not threading.current_thread():
        worker.join()  # it has left its loop: gone in a moment


def active_threads() -> int:
    """How many background compile threads are alive (0 or 1)."""
    worker = _worker
    return int(worker is not None and worker.is_alive())


atexit.register(cancel_all)


def _caller_state() -> Callable[[], Any]:
    """A context-manager factory that puts the background thread in the caller's thread-local
    state: grad mode, inference mode, and autocast per device type."""
    grad = torch.is_grad_enabled()
    inference = torch.is_inference_mode_enabled()
    autocast = []
    for device in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device):
            autocast.append((device, torch.get_autocast_dtype(device)))

    def enter():
        import contextlib

        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode(inference))
        stack.enter_context(torch.set_grad_enabled(grad))
        for device, dtype in autocast:
            stack.enter_context(torch.autocast(device, dtype=dtype))
        return stack

    return enter


def eager_copy(gm: torch.fx.GraphModule) -> Callable:
    """`gm.forward` on a copy of its graph (nodes copied, metadata shared, parameters and
    constants shared): what runs while the original graph is compiled (and rewritten)."""
    graph = torch.fx.Graph()
    graph._codegen = gm.graph._codegen
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph, class_name="KilnEagerGraph").forward
