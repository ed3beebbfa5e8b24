"""The `aot_eager` backend: kiln's AOT autograd with eager ATen kernels as the "compiler".

Takes a captured graph and its example inputs (the backend contract); gives the callable of
`aot_compile` whose forward, backward and inference graphs run as `GraphModule`s, each ATen op
an eager kernel call. It traces, decomposes and partitions exactly as the code generator's path
does, so it is the reference that separates autograd bugs from code-generation bugs.
"""

from __future__ import annotations

from typing import Callable

import torch.fx

from .compile import aot_compile


def eager_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """A graph compiler that compiles nothing: the graph runs op by op on eager kernels."""
    return gm.forward


def aot_eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    return aot_compile(gm, example_inputs, fw_compiler=eager_graph, bw_compiler=eager_graph)


def aot_eager_default_partition(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """`aot_eager` saving every value the backward reads (no recomputation), for comparisons."""
    return aot_compile(
        gm,
        example_inputs,
        fw_compiler=eager_graph,
        bw_compiler=eager_graph,
        partition="save_all",
    )
