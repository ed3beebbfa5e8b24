"""`contextvars.ContextVar` inside a trace: get/set/reset run for real, and are modelled so that
later calls leave every variable as eager would and re-check what the trace read.

Takes the ContextVar calls the interpreter meets (`var.get()`, `var.set(v)`, `var.reset(token)`)
and reads of a token's `old_value`; gives their real results (the trace runs them, so the traced
call sees eager's values exactly) while keeping a shadow of each variable's state:

  ENTRY                     what it held when the frame was entered: a read guards it
  ("set", value, token)     a value this trace set
  ("token", token, source)  an outside token's old value (a continuation resetting a token
                            its caller's graph made): a read guards `token.old_value`

After the graph runs, the residual program replays only the net effect: the outside tokens'
resets, then `var.set(final value)` if the trace left one. A set/reset pair around the traced
region (transformers' output collector) thus costs no break, no guard and no replay.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from . import guards as G
from .sources import UNSET, AttrSource, ContextVarSource, Source
from .symbolic import plain as sym_plain

ENTRY = ("entry",)
NOT_MODELLED = object()


@dataclass
class _Var:
    var: ContextVar
    entry: Any  # its raw value when the frame was entered (UNSET: none)
    state: tuple = ENTRY
    outside_resets: list[tuple[Token, Source]] = field(default_factory=list)
    tokens: list[Token] = field(default_factory=list)  # made by this trace, in order


class ContextVarModel:
    """The shadow state of the ContextVars one trace touched."""

    def __init__(self, tracer) -> None:
        self.tracer = tracer
        self.vars: dict[int, _Var] = {}
        self.made: dict[int, tuple[Token, _Var, tuple]] = {}  # id(token) -> (token, var, prior)
        self.used: set[int] = set()  # tokens of this trace already reset

    def _var(self, var: ContextVar) -> _Var:
        v = self.vars.get(id(var))
        if v is None:
            v = self.vars[id(var)] = _Var(var, var.get(UNSET))
            self.tracer.keepalive.append(var)
        return v

    # ---- the calls ----------------------------------------------------------------------------
    def get(self, var: ContextVar, args: tuple, kwargs: dict) -> Any:
        self._guard_state(var, self._var(var).state)
        return var.get(*args, **kwargs)

    def set(self, var: ContextVar, args: tuple, kwargs: dict) -> Any:
        args = tuple(sym_plain(a) for a in args)  # native readers must see plain numbers
        v = self._var(var)  # before the set: it reads the entry value
        token = var.set(*args, **kwargs)
        self.made[id(token)] = (token, v, v.state)
        self.tracer.keepalive.append(token)
        v.tokens.append(token)
        v.state = ("set", args[0], token)
        return token

    def reset(self, var: ContextVar, args: tuple, kwargs: dict) -> Any:
        token = args[0] if len(args) == 1 and not kwargs else None
        if type(token) is not Token:
            return var.reset(*args, **kwargs)  # raises as eager does
        v = self._var(var)
        made = self.made.get(id(token))
        if made is not None and made[0] is token:
            var.reset(token)
            self.used.add(id(token))
            v.state = made[2]
            return None
        src = self.tracer.source_of(token)
        if src is None or token.var is not var:
            return NOT_MODELLED
        var.reset(token)
        v.outside_resets.append((token, src))
        v.state = ("token", token, src)
        self.tracer.effects_visible = True  # a token from outside is used up: can't undo
        return None

    def token_attr(self, token: Token, name: str) -> Any:
        """`token.old_value` depends on the variable's state when the token was made."""
        value = getattr(token, name)
        made = self.made.get(id(token))
        src = self.tracer.source_of(token)
        if name == "old_value":
            if made is not None and made[0] is token:
                self._guard_state(token.var, made[2])
            elif src is not None:
                self._guard_old_value(token, src)
        elif name == "var" and src is not None and made is None:
            self.tracer.track(value, AttrSource(src, "var"))
        return value

    # ---- guards -------------------------------------------------------------------------------
    def _guard_state(self, var: ContextVar, state: tuple) -> None:
        if state is ENTRY:
            src = ContextVarSource(var)
            raw = self._var(var).entry
            if raw is UNSET:
                self.tracer.guards.add(G.Guard(src, "CVAR", "{s} is {u}", {"u": UNSET}, "unset"))
            else:
                self.tracer.track(raw, src)
        elif state[0] == "token":
            self._guard_old_value(state[1], state[2])

    def _guard_old_value(self, token: Token, src: Source) -> None:
        old = AttrSource(src, "old_value")
        if token.old_value is Token.MISSING:
            text = "is Token.MISSING"
            self.tracer.guards.add(G.Guard(old, "CVAR", "{s} is {m}", {"m": Token.MISSING}, text))
        else:
            self.tracer.track(token.old_value, old)

    # ---- after the trace ----------------------------------------------------------------------
    def replay(self, rb) -> None:
        """Add to the residual (after the graph, as `rb.lets`, so tokens it hands out are bound
        before any value refers to them) the calls that leave each variable as the trace did."""
        from .residual import NotRebuildable

        for v in self.vars.values():
            cv = rb.namer.const(v.var, "cv")
            after: tuple = ENTRY
            for token, src in v.outside_resets:
                rb.lets.append(f"{cv}.reset({src.expr(rb.namer)})")
                after = ("token", token, src)
            final = v.state
            if final[0] == "set":
                name = f"___tok{len(rb.lets)}"
                rb.lets.append(f"{name} = {cv}.set({rb.expr(final[1])})")
                token = final[2]
                if _same(self.made[id(token)][2], after):  # the replayed token is that token
                    rb.memo_name(token, name)
            elif not _same(final, after):
                raise NotRebuildable(
                    f"ContextVar {v.var.name!r} is reset to a state kiln cannot replay"
                )

    def undo(self) -> bool:
        """Put every variable back as the frame found it (before CPython reruns the frame);
        False when that is impossible."""
        for v in self.vars.values():
            if v.state is ENTRY:
                continue
            if v.outside_resets:
                return False
            first = [t for t in v.tokens if self.made[id(t)][2] is ENTRY and id(t) not in self.used]
            if not first:
                return False
            v.var.reset(first[0])
            v.state = ENTRY
        return True


def _same(a: tuple, b: tuple) -> bool:
    return a is b or (a[0] == b[0] == "token" and a[1] is b[1])


def call(interp, fn, args: tuple, kwargs: dict) -> Any:
    """A ContextVar method (bound, or through the class with the variable first)."""
    bound = type(getattr(fn, "__self__", None)) is ContextVar
    if not bound and (not args or type(args[0]) is not ContextVar):
        return fn(*args, **kwargs)  # a bad call: CPython's error
    var, rest = (fn.__self__, args) if bound else (args[0], args[1:])
    tracer = interp.tracer
    name = fn.__name__
    if tracer.recording and name in ("get", "set", "reset"):
        result = getattr(tracer.context_vars, name)(var, rest, kwargs)
        if result is not NOT_MODELLED:
            return result
        from .calls import _break_and_run

        return _break_and_run(
            interp,
            fn,
            args,
            kwargs,
            "ContextVar.reset with a token kiln cannot trace back to the call's inputs",
            "reset the variable in the function that set it",
        )
    return fn(*args, **kwargs)


__all__ = ["ContextVarModel", "call", "ENTRY"]
