"""reduce-overhead and communication: a graph that communicates (functional collectives) is
never replayed as a device graph (capture is not coordinated across ranks: a hang), while
graphs without communication (a DDP or FSDP model's own: their communication runs between
graphs) are. Checked on graphs built here; the CPU has no device graphs to replay."""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives  # noqa: F401  (registers _c10d_functional)
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.runtime.device_graphs import (
    GraphedCallable,
    GraphGroup,
    device_graph_refusal,
    wrap_compilers,
)


def _communicating_graph() -> fx.GraphModule:
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, x))
    r = g.call_function(torch.ops._c10d_functional.all_reduce.default, (y, "sum", "0"))
    w = g.call_function(torch.ops._c10d_functional.wait_tensor.default, (r,))
    g.output((w,))
    return fx.GraphModule({}, g)


def test_graphs_that_communicate_are_not_device_graphed():
    comm = _communicating_graph()
    plain = make_fx(lambda x: (x.sin() * 2,))(torch.randn(3))
    reason = device_graph_refusal(comm)
    assert reason is not None and "_c10d_functional::all_reduce" in reason
    assert "lock-step" in reason
    assert device_graph_refusal(plain) is None
    for kind in ("fw_compiler", "bw_compiler", "inference_compiler"):
        compilers = wrap_compilers(lambda gm, ex: gm, lambda gm, ex: gm, GraphGroup())
        assert not isinstance(compilers[kind](comm, []), GraphedCallable), kind
        assert isinstance(compilers[kind](plain, []), GraphedCallable), kind
