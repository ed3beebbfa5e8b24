"""torch.distributed's collectives met in a trace: which run between graphs, and why.

Takes a Python function a trace is about to call; gives whether it is one of c10d's eager
collectives (`dist.all_reduce(t)`, `broadcast`, `all_gather`, `barrier`, send/recv, ...) and
the break reason. Those communicate in place on their tensors through a process group object
(C++) a graph cannot hold, and must run exactly once per call on every rank: run inside the
trace and then again as the step after a break, a collective would reduce twice (a wrong
value) or once on one rank and twice on another (a hang). So the call itself is the break:
the graph so far ends before it, it runs once in plain Python, and a continuation takes the
rest. The functional collectives (`torch.distributed._functional_collectives`) are ops
(`_c10d_functional.all_reduce`, `wait_tensor`) with no side effect on their inputs: they are
recorded in graphs like any torch op. Eagerly they hand back an AsyncCollectiveTensor that
waits when first used, a tensor subclass a compiled kernel cannot read; asked by
`_are_we_tracing()`, kiln answers that it is tracing, so the collective's result is waited for
at once by a recorded `wait_tensor` (correct; the collective does not overlap the compute
after it within the graph).
"""

from __future__ import annotations

import functools

C10D = "torch.distributed.distributed_c10d"
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "all_gather",
        "all_gather_coalesced",
        "all_gather_into_tensor",
        "_all_gather_base",
        "all_gather_object",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "monitored_barrier",
        "batch_isend_irecv",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "gather_object",
        "irecv",
        "isend",
        "recv",
        "recv_object_list",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "scatter",
        "scatter_object_list",
        "send",
        "send_object_list",
    }
)
TRACING_QUERY = ("torch.distributed._functional_collectives", "_are_we_tracing")
HINT = (
    "it runs once, between graphs, as in eager; to keep communication inside a graph, use "
    "torch.distributed._functional_collectives (recorded as graph ops)"
)


@functools.lru_cache(maxsize=1)
def eager_collectives() -> frozenset[tuple[str, str]]:
    return frozenset((C10D, name) for name in COLLECTIVES)


def reason(fn) -> str:
    return (
        f"torch.distributed.{fn.__name__} communicates in place through a process group (a C++ "
        "object a graph cannot hold)"
    )
