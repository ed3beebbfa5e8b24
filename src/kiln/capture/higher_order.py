"""Control-flow operators inside a trace: `torch.cond` and `while_loop`, as graph nodes.

Takes the call as the interpreter meets it; gives the call's result (eager's values) and, in the
graph, one `torch.ops.higher_order.cond` / `while_loop` node whose branches (loop condition and
body) are FX subgraphs held by the graph module. Each branch is captured by kiln's own
interpreter: it is traced inline on copies of the operands (the branch not taken must change
nothing), its recorded nodes are moved into a subgraph, and every value it reads from outside
(a parameter, an earlier result) becomes one more operand of the node, as torch does. AOT
autograd traces the node with make_fx, which differentiates `cond` through torch's own rule.

A Python (or guarded symbolic) predicate is no control flow at all: the branch it picks is
called inline, as eager `torch.cond` does. What a subgraph cannot hold (a graph break inside a
branch, a branch changing its operand in place, branches returning different shapes) ends the
graph before the call with that reason, and the call runs as in eager. Uses torch rejects
(outputs that alias an input, branches returning different numbers of outputs or dtypes, a
predicate with more than one element) raise torch's errors.
"""

from __future__ import annotations

import operator
import sys
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .errors import SubgraphBreak

COND = sys.modules["torch._higher_order_ops.cond"].cond
try:
    WHILE_LOOP = sys.modules["torch._higher_order_ops.while_loop"].while_loop
except KeyError:  # a torch without while_loop
    WHILE_LOOP = None
ENTRY_POINTS = tuple(f for f in (COND, WHILE_LOOP) if f is not None)

_BODY_OPS = ("call_function", "call_method")
_HINT = "keep torch.cond/while_loop branches to tensor operations on their operands"


def call(interp, fn, args: tuple, kwargs: dict, native_call, inline) -> Any:
    """`torch.cond(...)` or `while_loop(...)` met by the interpreter. `native_call(interp, fn,
    args, kwargs)` runs a call natively, `inline(fn, args)` on the interpreter (calls.py; passed
    in, so that this module imports nothing that imports it)."""
    if fn is COND:
        return _cond(interp, fn, args, kwargs, native_call, inline)
    return _while_loop(interp, fn, args, kwargs, native_call, inline)


# ---- cond ---------------------------------------------------------------------------------------
def _bind_cond(pred, true_fn, false_fn, operands=()):
    return pred, true_fn, false_fn, operands


def _cond(interp, fn, args, kwargs, native_call, inline):
    pred, true_fn, false_fn, operands = _bind_cond(*args, **kwargs)
    if not isinstance(pred, torch.Tensor):
        # a Python condition (a shape test: a guarded symbolic bool): eager runs one branch
        if not isinstance(pred, (bool, int, float)):
            raise RuntimeError(f"Expected pred to be bool or tensor, but got {pred}.")
        return inline(true_fn if pred else false_fn, tuple(operands))
    _check_cond_args(pred, true_fn, false_fn, operands)
    tracer = interp.tracer
    if not tracer.recording:
        return native_call(interp, fn, args, kwargs)
    flat, spec = pytree.tree_flatten(tuple(operands))
    cap = _Capture(interp, inline)
    try:
        if tracer.dyn is not None:
            raise SubgraphBreak("torch.cond over tensors with symbolic sizes is not captured yet")

        def as_args(copies):
            return tuple(pytree.tree_unflatten(copies, spec))

        t_out, t_spec = cap.branch(true_fn, flat, as_args, "true branch")
        f_out, f_spec = cap.branch(false_fn, flat, as_args, "false branch")
        _check_branch_outputs(t_out, f_out, t_spec, f_spec)
        free = cap.free_nodes()
        subs = [cap.subgraph(i, free) for i in range(2)]
        values = cap.free_values(free, flat)
        cap.erase()
        # the call's result: torch's operator on the real values, as eager's torch.cond runs
        # it (its gradients: zeros for what only the other branch reads, not None)
        with torch._C.DisableTorchFunction():
            chosen = torch.ops.higher_order.cond(pred, subs[0], subs[1], tuple(values))
        _record(
            tracer,
            torch.ops.higher_order.cond,
            [tracer.node_of(pred), *subs, tuple(free)],
            ("cond_true", "cond_false"),
            tuple(chosen),
        )
    except SubgraphBreak as e:
        cap.erase()
        tracer.graph_break(f"torch.cond: {e.reason}", _HINT)
        return native_call(interp, fn, args, kwargs)  # the graph already broke: run it natively
    return pytree.tree_unflatten(list(chosen), t_spec)


def _check_cond_args(pred, true_fn, false_fn, operands) -> None:
    """torch.cond's own argument checks, with its messages."""
    if pred.numel() != 1:
        raise RuntimeError(f"Expected pred to be bool or single-element tensor, but got {pred}.")
    if not callable(true_fn) or not callable(false_fn):
        raise RuntimeError("Expect both branches to be callable.")
    if not isinstance(operands, (tuple, list)) or pytree.tree_any(
        lambda t: not isinstance(t, torch.Tensor), operands
    ):
        raise RuntimeError(
            "Expect operands to be a tuple of possibly nested dict/list/tuple that only "
            f"consists of tensor leaves, but got {operands}."
        )


def _check_branch_outputs(t_out, f_out, t_spec, f_spec) -> None:
    if len(t_out) != len(f_out) or t_spec != f_spec:
        raise RuntimeError(
            "Expected to return same number of outputs but got:"
            f"\n  true branch returns {len(t_out)} item(s)"
            f"\n  false branch returns {len(f_out)} item(s)"
        )
    for a, b in zip(t_out, f_out):
        for what in ("dtype", "device"):
            if getattr(a, what) != getattr(b, what):
                raise RuntimeError(
                    "When merging two branches' output in torch.cond, expected same "
                    f"{what} but got {getattr(a, what)} and {getattr(b, what)}."
                )
        if a.shape != b.shape:
            raise SubgraphBreak(
                f"the branches return different shapes ({list(a.shape)} and {list(b.shape)}): "
                "the result's shape depends on the predicate's value"
            )


# ---- while_loop ---------------------------------------------------------------------------------
def _bind_while(cond_fn, body_fn, carried_inputs, additional_inputs=()):
    return cond_fn, body_fn, carried_inputs, additional_inputs


def _while_loop(interp, fn, args, kwargs, native_call, inline):
    cond_fn, body_fn, carried, additional = _bind_while(*args, **kwargs)
    tracer = interp.tracer
    if not callable(cond_fn) or not callable(body_fn):
        raise RuntimeError("Expect cond_fn and body_fn to be callable.")
    if not tracer.recording:
        return native_call(interp, fn, args, kwargs)
    c_flat, c_spec = pytree.tree_flatten(tuple(carried))
    a_flat, a_spec = pytree.tree_flatten(tuple(additional))
    flat, n_carried = c_flat + a_flat, len(c_flat)

    def as_args(values):
        return (
            *pytree.tree_unflatten(values[:n_carried], c_spec),
            *pytree.tree_unflatten(values[n_carried:], a_spec),
        )

    cap = _Capture(interp, inline)
    try:
        if tracer.dyn is not None:
            raise SubgraphBreak("while_loop over tensors with symbolic sizes is not captured yet")
        if not all(isinstance(t, torch.Tensor) for t in flat):
            raise SubgraphBreak("while_loop carries Python numbers; only tensors are captured")
        c_out, _ = cap.branch(cond_fn, flat, as_args, "cond_fn")
        if len(c_out) != 1 or c_out[0].dtype != torch.bool or c_out[0].dim() != 0:
            raise RuntimeError(
                f"cond_fn must return a boolean scalar tensor or a boolean but got {c_out}"
            )
        b_out, _ = cap.branch(body_fn, flat, as_args, "body_fn")
        if len(b_out) != n_carried:
            raise RuntimeError(
                "body_fn should return the same number of elements as carried_inputs, got "
                f"{len(b_out)} vs {n_carried}"
            )
        for a, b in zip(flat[:n_carried], b_out):
            if (a.shape, a.dtype, a.device) != (b.shape, b.dtype, b.device):
                raise SubgraphBreak(
                    "body_fn changes a carried value's shape, dtype or device "
                    f"({list(a.shape)} {a.dtype} -> {list(b.shape)} {b.dtype})"
                )
        free = cap.free_nodes()
        subs = [cap.subgraph(0, free, single=True), cap.subgraph(1, free)]
        cap.erase()
        result = _run_loop(cond_fn, body_fn, flat, n_carried, as_args, c_spec)
        _record(
            tracer,
            torch.ops.higher_order.while_loop,
            [*subs, tuple(free[:n_carried]), tuple(free[n_carried:])],
            ("while_cond", "while_body"),
            result,
        )
    except SubgraphBreak as e:
        cap.erase()
        tracer.graph_break(f"while_loop: {e.reason}", _HINT)
        return native_call(interp, fn, args, kwargs)
    return pytree.tree_unflatten(list(result), c_spec)


def _run_loop(cond_fn, body_fn, flat: list, n_carried: int, as_args, c_spec) -> tuple:
    """The loop on the real values, as torch's eager implementation runs it (new tensors out,
    even when the body never runs); kiln's recording is off, the graph has the node."""
    extra = flat[n_carried:]
    with torch._C.DisableTorchFunction():
        vals = list(flat[:n_carried])
        while bool(cond_fn(*as_args(vals + extra))):
            vals = pytree.tree_leaves(body_fn(*as_args(vals + extra)))
        return tuple(v.clone() if any(v is c for c in flat) else v for v in vals)


# ---- capturing a branch -------------------------------------------------------------------------
class _Capture:
    """Branches traced inline into the frame's graph, then moved out into subgraphs."""

    def __init__(self, interp, inline) -> None:
        self.inline = inline
        self.tracer = interp.tracer
        self.operand_nodes: list[fx.Node] | None = None
        self.bodies: list[list[fx.Node]] = []
        self.outputs: list[list[fx.Node]] = []
        self.erased = False

    def branch(self, fn, flat: list, as_args, label: str) -> tuple[list, Any]:
        """Trace `fn(*operands)` on copies of the operands; gives its flat outputs and their
        structure. Its nodes stay in the frame's graph until `erase`."""
        tracer = self.tracer
        if self.operand_nodes is None:
            self.operand_nodes = [tracer.node_of(t) for t in flat]
        before = set(tracer.graph.nodes)
        copies = []
        with torch._C.DisableTorchFunction():
            for t in flat:
                # a copy (autograd-connected, so the result's gradients reach the operand): a
                # branch that changes it in place changes nothing of the program's
                c = t.clone()
                copies.append(c)
        for c, node in zip(copies, self.operand_nodes):
            tracer.tensor_nodes[id(c)] = node
            tracer.keepalive.append(c)
        sizes = dict(tracer._size_nodes)
        tracer.branch_capture += 1
        try:
            out = self.inline(fn, as_args(copies))
        finally:
            tracer.branch_capture -= 1
            tracer._size_nodes = sizes
            body = [n for n in tracer.graph.nodes if n not in before]
            self.bodies.append([n for n in body if n.op in _BODY_OPS])
        flat_out, out_spec = pytree.tree_flatten(out)
        nodes = []
        body_set = set(self.bodies[-1])
        for o in flat_out:
            if not isinstance(o, torch.Tensor):
                raise SubgraphBreak(
                    f"the {label} returns a {type(o).__name__}; only tensors are captured"
                )
            node = tracer.tensor_nodes.get(id(o))
            if node is None or node not in body_set or _aliases(o, copies):
                raise RuntimeError(
                    f"torch.cond/while_loop ({label}): Higher order ops do not support "
                    "aliasing: a branch returns one of its inputs or a view of one. Replace "
                    "`return input` with `return input.clone()` to avoid aliasing."
                )
            nodes.append(node)
        for n in self.bodies[-1]:
            if _mutates(n) and n.args and isinstance(n.args[0], fx.Node):
                if n.args[0] not in body_set:
                    raise SubgraphBreak(f"the {label} changes a tensor from outside it in place")
        self.outputs.append(nodes)
        return flat_out, out_spec

    def free_nodes(self) -> list[fx.Node]:
        """The operands, then every other outside value the branches read, in order."""
        free = list(self.operand_nodes or ())
        seen = set(free)
        for body in self.bodies:
            inside = set(body)
            for n in body:
                for a in n.all_input_nodes:
                    if a not in inside and a not in seen:
                        seen.add(a)
                        free.append(a)
        return free

    def free_values(self, free: list[fx.Node], operands: list) -> list:
        """The real tensors of the `free` nodes (the operands first)."""
        values = list(operands)
        for n in free[len(operands) :]:
            v = _value_of(self.tracer, n)
            if v is None:
                raise SubgraphBreak(f"a branch reads a value kiln no longer holds ({n.name})")
            values.append(v)
        return values

    def subgraph(self, i: int, free: list[fx.Node], single: bool = False) -> fx.GraphModule:
        """Branch `i` as a graph of the `free` values; its outputs as a tuple (or the one
        output itself: while_loop's condition)."""
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for k, n in enumerate(free):
            env[n] = g.placeholder(f"arg{k}")
            if "example_value" in n.meta:
                env[n].meta["example_value"] = n.meta["example_value"]
        for n in self.bodies[i]:
            env[n] = g.node_copy(n, env.__getitem__)
        outs = tuple(env[n] for n in self.outputs[i])
        g.output(outs[0] if single else outs)
        return fx.GraphModule(torch.nn.Module(), g)

    def erase(self) -> None:
        """Take the branches' nodes out of the frame's graph (and kiln's tables)."""
        if self.erased:
            return
        self.erased = True
        gone = {n for body in self.bodies for n in body}
        if gone:
            self.tracer.forget_nodes(gone)


def _record(tracer, target, args: list, names: tuple, outputs: tuple) -> fx.Node:
    """A control-flow operator (capture/higher_order.py): one node whose subgraphs (the
    GraphModules among `args`, named after `names`) the graph module holds; `outputs`,
    the real results, are bound to its items."""
    node_args = []
    names_left = iter(names)
    for a in args:
        if isinstance(a, fx.GraphModule):
            name = tracer._fresh(f"{next(names_left)}_graph")
            tracer.constants[name] = a  # a submodule of the graph module (frontend)
            a = tracer.graph.get_attr(name)
            if tracer._first_op is None:
                tracer._first_op = a
        node_args.append(a)
    node = tracer._op_node("call_function", target, tuple(node_args), {})
    tracer._bind_outputs(tuple(outputs), node)
    return node


def _value_of(tracer, node: fx.Node) -> torch.Tensor | None:
    """The real tensor a graph node stands for now (None if kiln no longer holds it)."""
    if node.op == "get_attr":
        return tracer.constants.get(node.target)
    for key, n in tracer.tensor_nodes.items():
        if n is not node:
            continue
        value = tracer.held_value(key)
        if value is None and key in tracer.sources:
            value = tracer.sources[key][0]
        if value is None:
            value = next((t for t in tracer.keepalive if id(t) == key), None)
        if value is not None:
            return value
    return None


def _aliases(t: torch.Tensor, copies: list) -> bool:
    with torch._C.DisableTorchFunction():
        ptr = t.untyped_storage().data_ptr()
        return any(c.untyped_storage().data_ptr() == ptr for c in copies if c.numel())


def _mutates(n: fx.Node) -> bool:
    target = n.target
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if target is operator.setitem or name in ("setitem", "__setitem__"):
        return True
    return "out" in n.kwargs or name.endswith("_") and not name.endswith("__")
