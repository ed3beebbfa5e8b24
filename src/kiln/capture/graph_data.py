"""A captured FX graph as plain data, and back: what the capture cache keeps of a graph.

Takes the graph a trace recorded (torch-level: call_function / call_method / get_attr nodes,
placeholders, one output) with its constant tensors; gives `dump(graph, constants, enc)`, plain
data whose call targets and odd arguments go through a `recipes.Encoder`, and `load(data,
resolver)`, a `LazyGraphModule` with the same node names, targets, arguments and the node
facts compilation reads (`example_value` as meta tensors of the same sizes, strides and dtype,
`kiln_layout_guarded`, `recompute`, `source`). The artifact cache (backends/warm.py) keys a
compiled graph by these, so a graph loaded here finds the compiled entry the first process
stored.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from ..lazy_graphs import LazyGraphModule
from . import module_tree
from .recipes import Encoder, Resolver, Uncacheable

_MARKS = ("kiln_layout_guarded", "recompute", "ac_graph_id", "source")


def dump(graph: fx.Graph, constants: dict[str, torch.Tensor], enc: Encoder) -> dict:
    nodes = []
    for n in graph.nodes:
        if n.op == "call_module":
            raise Uncacheable(f"the graph calls a module ({n.target})")
        if n.op == "call_function":
            target = enc.value(n.target)
        else:
            target = ("v", n.target)
        meta = {k: n.meta[k] for k in _MARKS if k in n.meta}
        if not all(type(v) in (bool, str, int) for v in meta.values()):
            raise Uncacheable(f"node {n.name} has marks that are not plain values")
        if "example_value" in n.meta:
            meta["example_value"] = _layout(n.meta["example_value"], n.name)
        nodes.append((n.op, n.name, target, _arg(n.args, enc), _arg(n.kwargs, enc), meta))
    for name, t in constants.items():
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
            raise Uncacheable(f"constant {name} is a {type(t).__name__}")
    return {"nodes": nodes, "constants": _dump_constants(constants)}


def _dump_constants(constants: dict[str, torch.Tensor]) -> list:
    """Constant tensors as plain data: each one's storage as bytes (one copy per storage that
    several share), and its dtype, geometry, device and parameter flags. `torch.load` of the
    same, zip container and restricted unpickler, cost a GPT-2 warm start more than its graph."""
    storages: dict[tuple, int] = {}
    blobs: list[bytes] = []
    out = []
    for name, t in constants.items():
        storage = t.untyped_storage()
        where = (t.device, storage.data_ptr(), storage.nbytes())
        if where not in storages:
            storages[where] = len(blobs)
            if t.device.type not in ("cpu", "cuda"):
                raise Uncacheable(f"constant {name} is on {t.device}")
            blobs.append(bytes(storage.cpu()))
        geometry = (tuple(t.shape), tuple(t.stride()), t.storage_offset())
        flags = (type(t) is torch.nn.Parameter, t.requires_grad)
        out.append((name, storages[where], str(t.dtype), geometry, str(t.device), flags))
    return [blobs, out]


def _load_constants(data: list) -> dict[str, torch.Tensor]:
    blobs, specs = data
    storages: dict[tuple[int, str], torch.UntypedStorage] = {}
    constants: dict[str, torch.Tensor] = {}
    for name, index, dtype, (size, stride, offset), device, (param, grad) in specs:
        storage = storages.get((index, device))
        if storage is None:
            raw = blobs[index]
            host = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0)
            storage = storages[(index, device)] = host.to(device).untyped_storage()
        dt = getattr(torch, dtype.removeprefix("torch."))
        t = torch.empty(0, dtype=dt, device=device).set_(storage, offset, size, stride)
        constants[name] = torch.nn.Parameter(t, grad) if param else t.requires_grad_(grad)
    return constants


def _layout(v: Any, name: str) -> Any:
    if isinstance(v, torch.Tensor):
        if v.layout != torch.strided or isinstance(v, torch._subclasses.FakeTensor):
            raise Uncacheable(f"node {name}'s example is a {type(v).__name__}")
        return ("tensor", tuple(v.shape), tuple(v.stride()), v.dtype)
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, [_layout(x, name) for x in v])
    if v is None or type(v) in (bool, int, float):
        return ("v", v)
    raise Uncacheable(f"node {name}'s example is a {type(v).__name__}")


def _unlayout(d: Any) -> Any:
    tag = d[0]
    if tag == "tensor":
        return torch.empty_strided(d[1], d[2], dtype=d[3], device="meta")
    if tag in ("tuple", "list"):
        items = [_unlayout(x) for x in d[1]]
        return tuple(items) if tag == "tuple" else items
    return d[1]


def _arg(a: Any, enc: Encoder) -> tuple:
    if isinstance(a, fx.Node):
        return ("n", a.name)
    if type(a) is tuple:  # (not a named tuple: those are values of their own type)
        return ("tuple", [_arg(x, enc) for x in a])
    if isinstance(a, list):  # FX keeps arguments in its immutable_list / immutable_dict
        return ("list", [_arg(x, enc) for x in a])
    if isinstance(a, dict):
        return ("dict", [(k, _arg(v, enc)) for k, v in a.items()])
    if type(a) is slice:
        return ("slice", [_arg(a.start, enc), _arg(a.stop, enc), _arg(a.step, enc)])
    return ("val", enc.value(a))


def _unarg(d: tuple, nodes: dict[str, fx.Node], res: Resolver) -> Any:
    tag, v = d
    if tag == "n":
        return nodes[v]
    if tag in ("tuple", "list"):
        items = [_unarg(x, nodes, res) for x in v]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict":
        return {k: _unarg(x, nodes, res) for k, x in v}
    if tag == "slice":
        return slice(*(_unarg(x, nodes, res) for x in v))
    return res.value(v)


def load(data: dict, res: Resolver) -> LazyGraphModule:
    graph = fx.Graph()
    made: dict[str, fx.Node] = {}
    for op, name, target, args, kwargs, meta in data["nodes"]:
        t = res.value(target)
        a, kw = _unarg(args, made, res), _unarg(kwargs, made, res)
        if op == "output":
            node = graph.output(a[0])
        else:
            node = graph.create_node(op, t, a, kw, name=name)
            if node.name != name:
                raise Uncacheable(f"node {name} came back as {node.name}")
        for k, v in meta.items():
            node.meta[k] = _unlayout(v) if k == "example_value" else v
        made[name] = node
    constants = _load_constants(data["constants"])
    with module_tree.suspended():
        root = torch.nn.Module()
        for name, t in constants.items():
            setattr(root, name, t)
        return LazyGraphModule(root, graph, class_name="KilnGraph")
