"""What happens at a graph break: compile the graph so far, take the one step in plain Python,
and hand the rest of the call to a continuation.

Takes the `GraphBreakAt` the interpreter raised (the frames, the step, the reason); gives the
call's result. The cache entry it installs runs the graph, replays side effects, rebuilds the
frames' live values, performs the step and calls the continuation; the current call does the
same with the real values. When the live state cannot be rebuilt on later calls, the function
runs eagerly from then on (the current call still finishes through the interpreter).
"""

from __future__ import annotations

from typing import Any

from .. import logs
from .continuations import (
    GraphBreakAt,
    NotResumable,
    continuation_key,
    resume_chain,
    snapshot,
    with_pc,
)
from .interpreter import Interpreter
from .residual import NotRebuildable
from .symbolic import _Sym, unwrap


def handle(cf, tracer, brk: GraphBreakAt) -> Any:
    root = getattr(cf, "root_cf", cf)
    root.breaks.append((brk.reason, brk.where, brk.hint))
    logs.once(
        f"break:{id(root)}:{brk.where}:{brk.reason}",
        "graph_breaks",
        f"graph break in {root.label}\n  at {brk.where}\n  reason: {brk.reason}"
        + (f"\n  hint: {brk.hint}" if brk.hint else ""),
    )
    try:
        specs, values = snapshot(tracer, brk.chain)
    except NotResumable as e:
        specs, values = None, []
        cf._give_up(
            f"graph break ({brk.reason}) at a point kiln cannot resume: {e}",
            tracer,
            brk.where,
            brk.hint,
        )
    step = brk.step
    conts: dict[bool, Any] = {}
    sized = {i for i, v in enumerate(values) if _has_sym(v)}
    if specs is not None:
        inner_pc = brk.chain[-1].pc
        if step[0] == "call":
            conts[True] = continuation(root, with_pc(specs, inner_pc, push=True), len(values) + 1)
        elif step[0] == "store":  # nothing goes on the stack after an attribute store
            conts[True] = continuation(root, with_pc(specs, inner_pc, push=False), len(values))
        else:
            _, _value, target, nxt, jump_if_true = step
            conts[jump_if_true] = continuation(root, with_pc(specs, target, False), len(values))
            conts[not jump_if_true] = continuation(root, with_pc(specs, nxt, False), len(values))
        for cont in conts.values():
            cont.sized_slots |= sized
        try:
            cf._install(tracer, None, tail=lambda rb: _tail(rb, step, values, conts))
        except NotRebuildable as e:
            cf._give_up(
                f"graph break ({brk.reason}); the state at the break cannot be rebuilt "
                f"on later calls: {e}",
                tracer,
                brk.where,
                brk.hint,
            )
    return _finish_call(cf, tracer, brk, specs, values, conts)


def _tail(rb, step: tuple, values: list, conts: dict) -> list[str]:
    vals = [rb.expr(v) for v in values]
    if step[0] == "call":
        _, fn, args, kwargs = step
        call_args = [rb.expr(a) for a in args]
        if kwargs:
            call_args.append("**" + rb.expr(dict(kwargs)))
        cont = rb.namer.const(conts[True], "cont")
        return [
            f"___r = {rb.expr(fn)}({', '.join(call_args)})",
            f"return {cont}({', '.join([*vals, '___r'])})",
        ]
    if step[0] == "store":
        _, obj, name, value = step
        cont = rb.namer.const(conts[True], "cont")
        return [
            f"setattr({rb.expr(obj)}, {name!r}, {rb.expr(value)})",
            f"return {cont}({', '.join(vals)})",
        ]
    _, value, _target, _nxt, _jump_if_true = step
    yes, no = rb.namer.const(conts[True], "cont"), rb.namer.const(conts[False], "cont")
    return [
        f"if {rb.expr(value)}:",
        f"    return {yes}({', '.join(vals)})",
        f"return {no}({', '.join(vals)})",
    ]


def _finish_call(cf, tracer, brk: GraphBreakAt, specs, values: list, conts: dict) -> Any:
    """Finish the call that broke, with its real values: the step, then the continuation."""
    step = brk.step
    try:
        if step[0] == "call":
            _, fn, args, kwargs = step
            # the step runs natively, as eager would run it: on plain numbers
            outcome = fn(*unwrap(tuple(args)), **unwrap(dict(kwargs)))
        elif step[0] == "store":
            _, obj, name, value = step
            outcome = setattr(obj, name, unwrap(value))
        else:
            outcome = bool(step[1])
    except Exception as e:  # the user's frame may catch it: finish concretely
        return _resume_concretely(cf, brk, exc=e)
    if specs is None:
        return _resume_concretely(cf, brk, outcome=outcome)
    # the continuation traces on its own: numbers symbolic in this trace are plain to it (they
    # would go on recording into this finished graph)
    values = [unwrap(v) for v in values]
    if step[0] == "call":
        return conts[True](*values, outcome)
    if step[0] == "store":
        return conts[True](*values)
    return conts[outcome](*values)


def concrete_interpreter(cf) -> Interpreter:
    """An interpreter whose tracer records nothing: it just finishes a call correctly."""
    from .tracer import Break, Tracer

    tracer = Tracer(cf.opts, lambda: "<running eagerly>")
    tracer.broken = Break("running eagerly", "", "")
    return Interpreter(tracer, cf.root_globals)


def _resume_concretely(cf, brk: GraphBreakAt, outcome: Any = None, exc=None) -> Any:
    interp = concrete_interpreter(cf)
    inner = brk.chain[-1]
    if exc is None:
        if brk.step[0] == "call":
            inner.stack.append(outcome)
        elif brk.step[0] == "branch":
            _, _value, target, nxt, jump_if_true = brk.step
            inner.pc = target if outcome == jump_if_true else nxt
    return resume_chain(interp, brk.chain, exc)


def continuation(root, specs, nvalues: int):
    """The continuation of `root` at `specs` (made on first use; frontend.Continuation)."""
    return root.continuation(continuation_key(specs), specs, nvalues)


def _has_sym(v) -> bool:
    if isinstance(v, _Sym):
        return True
    return isinstance(v, (list, tuple)) and any(_has_sym(x) for x in v)
