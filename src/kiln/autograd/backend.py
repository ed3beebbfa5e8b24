"""The `aot_eager` backends: kiln's AOT autograd with eager ATen kernels as the "compiler".

Takes a captured graph and its example inputs (the backend contract); gives the callable of
`aot_compile` whose forward, backward and inference graphs run as `GraphModule`s, each ATen op
an eager kernel call. Three variants, named as torch.compile names its debugging backends:

- `aot_eager`: functional ATen graphs, min-cut partition, no decompositions beyond what
  functionalisation needs. Each graph runs the kernels eager would run, so it is as fast as
  eager gets through AOT autograd, and it isolates the tracing, functionalisation, partition
  and runtime wrapper.
- `aot_eager_decomp_partition`: also kiln's decomposition table (decomps.py): exactly the
  graphs the code generator receives, run on eager kernels. A failure here and not in
  `aot_eager` points at a decomposition; one here and not in `inductor` at code generation.
- `aot_eager_save_all`: `aot_eager` saving every value the backward reads (no recomputation),
  the baseline that benchmarks/aot_partition.py compares the min-cut with.
"""

from __future__ import annotations

from typing import Callable

import torch.fx

from ..contracts import CaptureInfo, takes_capture_info
from .compile import aot_compile


class _BoxedCodeGen(torch.fx.graph.CodeGen):
    """Python code for a graph taking one list of inputs that it empties on entry, so each
    input is freed as soon as the graph is done with it (FX already drops dead locals)."""

    def gen_fn_def(self, free_vars, maybe_return_annotation, **kwargs):
        names = [v for v in free_vars if v != "self"]
        unpack = f"\n    {', '.join(names)}, = args_list" if names else ""
        header = f"def forward(self, args_list){maybe_return_annotation}:"
        return f"{header}{unpack}\n    args_list.clear()"


def eager_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """A graph compiler that compiles nothing: the graph runs op by op on eager kernels.

    The callable is boxed (`_boxed_call`): it takes the inputs as one list and empties it, so
    saved activations die during the backward instead of after it."""
    try:
        gm.graph.set_codegen(_BoxedCodeGen())
        gm.recompile()
    except Exception:  # a torch whose CodeGen differs: run unboxed, correct, less frugal
        gm.graph.set_codegen(torch.fx.graph.CodeGen())
        gm.recompile()
        return gm.forward
    forward = gm.forward

    def run(args_list: list):
        return forward(args_list)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _fixed(info: CaptureInfo | None) -> bool:
    return info is not None and info.fixed_call_key


@takes_capture_info
def aot_eager(gm: torch.fx.GraphModule, example_inputs: list, info=None) -> Callable:
    return aot_compile(
        gm,
        example_inputs,
        fw_compiler=eager_graph,
        bw_compiler=eager_graph,
        decompositions={},
        fixed_call_key=_fixed(info),
    )


@takes_capture_info
def aot_eager_decomp_partition(gm: torch.fx.GraphModule, example_inputs: list, info=None):
    return aot_compile(
        gm,
        example_inputs,
        fw_compiler=eager_graph,
        bw_compiler=eager_graph,
        fixed_call_key=_fixed(info),
    )


@takes_capture_info
def aot_eager_save_all(gm: torch.fx.GraphModule, example_inputs: list, info=None) -> Callable:
    return aot_compile(
        gm,
        example_inputs,
        fw_compiler=eager_graph,
        bw_compiler=eager_graph,
        decompositions={},
        partition="save_all",
        fixed_call_key=_fixed(info),
    )
