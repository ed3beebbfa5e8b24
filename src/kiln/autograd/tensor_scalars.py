"""Scalar arguments given as tensors: `p.addcdiv_(m, d, value=step_size)` with a 0-d tensor.

Takes the captured torch-level graph; rewrites in place each call whose `alpha=`/`value=` (a
Scalar in the op's schema) is a tensor of the graph into the same arithmetic on tensors, and
returns one line per call (`KILN_LOGS=aot_graphs`).

Why: eager reads such a tensor with `.item()` before the op runs, which a trace on fake tensors
cannot do (the value is data). torch's optimizers pass tensors there whenever a compiler is
tracing them (`torch.compiler.is_compiling()` keeps the step count a tensor, so the step size
and bias corrections are tensors): Adam's `param.addcdiv_(exp_avg, denom, value=-step_size)`.
The rewrite multiplies by the 0-d tensor instead, in the order eager's kernels apply the
scalar (`value * t1 / t2`, `alpha * other`); a 0-d tensor does not change the result's dtype.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

# name -> (the Scalar keyword, how the call is rebuilt from (self, *tensors, scalar)).
# Each rebuild gives the value eager's op gives with the scalar read out of the tensor.
_REBUILD = {
    "add": ("alpha", lambda s, o, a: torch.add(s, torch.mul(o, a))),
    "sub": ("alpha", lambda s, o, a: torch.sub(s, torch.mul(o, a))),
    "addcdiv": ("value", lambda s, t1, t2, v: torch.add(s, torch.div(torch.mul(t1, v), t2))),
    "addcmul": ("value", lambda s, t1, t2, v: torch.add(s, torch.mul(torch.mul(t1, v), t2))),
}


# `torch._foreach_addcdiv_(params, t1s, t2s, scalars)` with `scalars` a 1-d tensor (Adam's
# foreach step sizes under a compiler), whose fake kernel refuses a tensor it cannot read: one
# call per element, the same arithmetic as above with `scalars[i]`
_FOREACH = {"_foreach_addcdiv": "addcdiv", "_foreach_addcmul": "addcmul"}


def _name(node: torch.fx.Node) -> str | None:
    if node.op == "call_method" and isinstance(node.target, str):
        return node.target
    if node.op == "call_function":
        name = getattr(node.target, "__name__", None)
        if node.target in (getattr(torch, str(name), None), getattr(torch.Tensor, str(name), None)):
            return name
    return None


def _is_tensor(arg) -> bool:
    if not isinstance(arg, torch.fx.Node):
        return False
    example = arg.meta.get("example_value", arg.meta.get("val"))
    return isinstance(example, torch.Tensor)


def rewrite_tensor_scalars(gm: torch.fx.GraphModule) -> list[str]:
    """Rewrite calls with a tensor where the op takes a Scalar (see the module doc)."""
    notes = []
    for node in list(gm.graph.nodes):
        name = _name(node)
        if name is None:
            continue
        if name.rstrip("_") in ("_foreach_add", "_foreach_sub") and _is_tensor(
            node.kwargs.get("alpha")
        ):
            # `_foreach_add_(ps, gs, alpha=-lr)` (SGD): the others scaled by the tensor first
            others = node.args[1]
            if isinstance(others, (list, tuple)) and set(node.kwargs) == {"alpha"}:
                with gm.graph.inserting_before(node):
                    scaled = gm.graph.call_function(
                        torch._foreach_mul, (others, node.kwargs["alpha"])
                    )
                node.args = (node.args[0], scaled)
                node.kwargs = {}
                notes.append(f"{node.name}: {name} with a tensor alpha= scales by it first")
            continue
        if name.rstrip("_") in _FOREACH:
            if _rewrite_foreach(gm.graph, node, name):
                notes.append(f"{node.name}: {name} with tensor scalars became one call a tensor")
            continue
        in_place = name.endswith("_") and not name.startswith("_")
        base = name[:-1] if in_place else name
        entry = _REBUILD.get(base)
        if entry is None or not _is_tensor(node.kwargs.get(entry[0])):
            continue
        kwarg, rebuild = entry
        if set(node.kwargs) != {kwarg}:
            continue  # out=, rounding modes: left as they are
        with gm.graph.inserting_before(node):
            value = _record(gm.graph, rebuild, (*node.args, node.kwargs[kwarg]))
            if in_place:  # the new value goes back into `self`, which the call returns
                value = gm.graph.call_method("copy_", (node.args[0], value))
        node.replace_all_uses_with(value)
        gm.graph.erase_node(node)
        notes.append(f"{node.name}: {name} with a tensor {kwarg}= became tensor arithmetic")
    if notes:
        gm.graph.lint()
        gm.recompile()
    return notes


def _record(graph: torch.fx.Graph, rebuild, args: tuple) -> torch.fx.Node:
    """The nodes of `rebuild(*args)`, traced over the argument nodes."""
    tracer = torch.fx.proxy.GraphAppendingTracer(graph)
    proxies = [torch.fx.Proxy(a, tracer) if isinstance(a, torch.fx.Node) else a for a in args]
    return rebuild(*proxies).node


def _rewrite_foreach(graph: torch.fx.Graph, node: torch.fx.Node, name: str) -> bool:
    """`_foreach_addcdiv(_)` / `_foreach_addcmul(_)` with a tensor of scalars, element by
    element; False (left alone) unless its only users take items of its result."""
    args = list(node.args)
    if len(args) == 3 and set(node.kwargs) == {"scalars"}:
        args.append(node.kwargs["scalars"])
    elif len(args) != 4 or node.kwargs:
        return False
    lists, scalars = args[:3], args[3]
    if not _is_tensor(scalars) or not all(isinstance(a, (list, tuple)) for a in lists):
        return False
    if any(u.op != "call_function" or u.target is not operator.getitem for u in node.users):
        return False
    in_place = name.endswith("_")
    rebuild = _REBUILD[_FOREACH[name.rstrip("_")]][1]
    results = []
    with graph.inserting_before(node):
        for i, (s, t1, t2) in enumerate(zip(*lists)):
            scalar = graph.call_function(operator.getitem, (scalars, i))
            value = _record(graph, rebuild, (s, t1, t2, scalar))
            results.append(graph.call_method("copy_", (s, value)) if in_place else value)
    for user in list(node.users):
        user.replace_all_uses_with(results[user.args[1]])
        graph.erase_node(user)
    graph.erase_node(node)
    return True
