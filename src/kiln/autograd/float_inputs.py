"""Float inputs of a captured graph as 0-d float64 tensors, so a new value compiles nothing.

Takes the captured torch-level graph and its example inputs; finds the placeholders that take a
Python float (capture's symbolic floats: a learning rate a scheduler changes every step, see
capture/dynamic_floats.py) and makes them tensor inputs: each call passes
`torch.tensor(value, dtype=float64)` there (on the graph's accelerator when it has one). The
graph's Python arithmetic on the value (`1 - lr * wd`, `-lr`) then runs on the 0-d tensor, and
torch calls take it where they took the number; tensor_scalars.py rewrites the calls whose
schema wants a Scalar (`alpha=`, `value=`).

Why: AOT autograd bakes non-tensor inputs into the traced graphs, one compiled entry per value,
which for a learning rate is a compile per step. A 0-d tensor takes part in type promotion as a
Python number does (it never widens a dimensioned tensor's dtype), and float64 holds the
float exactly, so the values are eager's.
"""

from __future__ import annotations

import torch
import torch.fx


def float_positions(gm: torch.fx.GraphModule, example_inputs: list) -> list[int]:
    """Positions of the inputs that are Python floats (bools and ints stay baked in)."""
    return [i for i, x in enumerate(example_inputs) if type(x) is float]


def graph_device(example_inputs) -> torch.device | None:
    """Where the float inputs go: the device of the first tensor input not on the CPU (the
    graph's kernels run there), None when all are on the CPU."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type not in ("cpu", "meta"):
            return x.device
    return None


def as_tensors(args, positions: list[int], device: torch.device | None = None) -> list:
    """`args` with each float at `positions` a 0-d float64 tensor, on `device` when one is
    given: there the graph's arithmetic on it runs in its kernels (on the CPU beside CUDA
    tensors it would be an ATen call, and so would each op reading its result), and `full`
    fills it without a host-device copy (a CPU tensor copied in would wait for the GPU)."""
    args = list(args)
    if device is None:
        for i in positions:
            args[i] = torch.tensor(args[i], dtype=torch.float64)
    else:
        for i in positions:
            args[i] = torch.full((), args[i], dtype=torch.float64, device=device)
    return args


def make_tensor_inputs(gm: torch.fx.GraphModule, positions: list[int]) -> list[str]:
    """Mark the float placeholders, and every number-valued node computed from them, as the
    0-d tensors they are from now on (their example values), so later rewrites see tensors."""
    if not positions:
        return []
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    changed = {placeholders[i] for i in positions}
    for node in gm.graph.nodes:
        if node in changed:
            node.meta["example_value"] = _scalar(torch.float64)
            continue
        example = node.meta.get("example_value")
        number = example is None or type(example) in (float, int, bool)  # (Python arithmetic
        # on symbolic numbers records nodes without example values)
        if number and any(a in changed for a in node.all_input_nodes):
            changed.add(node)
            node.meta["example_value"] = _scalar(
                torch.bool if type(example) is bool else torch.float64
            )
    return [f"float input {placeholders[i].name}: a 0-d float64 tensor" for i in positions]


def _scalar(dtype: torch.dtype) -> torch.Tensor:
    return torch.empty((), dtype=dtype, device="meta")
