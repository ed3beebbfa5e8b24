"""The built-in devices: `cpu` (C++/OpenMP kernels) and `cuda` (Triton kernels).

Takes nothing; registers both in the device registry when kiln.devices is imported. Their code
generators (codegen/cpp/device.py, codegen/triton/device.py) and cuda's device graphs
(runtime/device_graphs.py) are named here and imported on first use.

The two differ only in what is written below: their rewrite lists and their capabilities.
* cpu reads at loaded indices (gather, embedding) and calls matmuls with `out=` into planned,
  reusable buffers in an arena kept between calls.
* cuda takes the bias add out of matmuls it can fuse into a pointwise kernel, scatters tied
  embedding gradients, pads unaligned matmuls; its Triton renderer has no indirect loads yet.
Both make convolutions channels-last and merge repeated calls.
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from . import LOOP_DTYPES, Capabilities, Device, register_device

aten = torch.ops.aten

CPU = Device(
    name="cpu",
    tensor_type="cpu",
    capabilities=Capabilities(
        dtypes=LOOP_DTYPES,
        indirect_loads=True,
        out_variants=MappingProxyType(
            {
                aten.mm.default: aten.mm.out,
                aten.addmm.default: aten.addmm.out,
                aten.bmm.default: aten.bmm.out,
                aten.baddbmm.default: aten.baddbmm.out,
            }
        ),
        arena=True,
        symbolic_sizes=True,
        # ctypes passes at most 1024 arguments; a GPT-2 AdamW step's 600 buffers make 3 calls
        horizontal=256,
    ),
    rewrites=(
        "functionalize_restrides",
        "fake_metadata",
        "channels_last_convolutions",
        "merge_repeats",
    ),
    codegen="kiln.codegen.cpp.device:CPP",
    graph_runner=None,
    description="C++/OpenMP kernels built with the system compiler (codegen/cpp)",
)

CUDA = Device(
    name="cuda",
    tensor_type="cuda",
    capabilities=Capabilities(
        dtypes=LOOP_DTYPES,
        indirect_loads=False,
        symbolic_sizes=True,
        # well inside a launch's 4 KiB of parameters; Triton's compile time grows with a
        # kernel's length, and a group this size compiles in seconds
        horizontal=128,
        # one-value intermediates (an optimizer step's bias corrections): no allocation a call
        small_arena=64,
        # one-value values recomputed per program, member sets as parts (Capabilities doc)
        many_programs=True,
    ),
    rewrites=(
        "functionalize_restrides",
        "fake_metadata",
        "unfuse_bias_adds",
        "scatter_embedding_grads",
        "pad_matmuls",
        "matvec_reductions",
        "channels_last_convolutions",
        "merge_repeats",
    ),
    codegen="kiln.codegen.triton.device:TRITON",
    graph_runner="kiln.runtime.device_graphs:CUDA_GRAPHS",
    description="Triton kernels (codegen/triton), CUDA graphs for reduce-overhead",
)

register_device("cpu", CPU)
register_device("cuda", CUDA)
