"""contextvars.ContextVar get/set/reset in compiled code: no graph break, every variable left as
eager leaves it, and a changed value that the traced code read is a recompile.

Each call runs in its own fresh `contextvars.Context`, set up identically for the eager and the
compiled run, and the variables' values at the end of the call are compared as well as the
outputs."""

import contextvars

import torch
from harness import CountingBackend, assert_same

import kiln

SCALE = contextvars.ContextVar("scale")
COLLECT = contextvars.ContextVar("collect", default=None)
MODE = contextvars.ContextVar("mode", default="plain")
ABSENT = object()
VARS = (SCALE, COLLECT, MODE)


def _state():
    return {v.name: v.get(ABSENT) for v in VARS}


def _run(fn, setup: dict, args):
    """fn(*args) in a fresh context after setting `setup`; (result, variables afterwards)."""

    def go():
        for var, value in setup.items():
            var.set(value)
        out = fn(*args)
        return out, _state()

    return contextvars.Context().run(go)


def _compare(fn, setups, make_args, graphs):
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    for setup in setups:
        args = make_args()
        expected, expected_state = _run(fn, setup, args)
        got, got_state = _run(compiled, setup, args)
        assert_same(got, expected)
        assert set(got_state) == set(expected_state)
        for name, value in expected_state.items():
            assert_same(got_state[name], value, f"ContextVar {name!r} after the call")
    state = compiled._kiln_compiled
    assert state.eager_reason is None, state.eager_reason
    assert not state.breaks, state.breaks
    assert len(backend.graphs) == graphs, f"expected {graphs} graph(s), got {len(backend.graphs)}"
    assert backend.runs >= len(setups) - graphs, "the compiled graph did not serve later calls"
    return compiled


def _hook(h):
    """A layer that appends to the active collector, as transformers' output hooks do."""
    collected = COLLECT.get()
    if collected is not None:
        collected.append(h)
    return h


def collector_forward(x, w):
    collected = []
    token = COLLECT.set(collected)
    try:
        h = _hook(torch.tanh(x @ w))
        h = _hook(h * 2 + 1)
    finally:
        COLLECT.reset(token)
    return h.sum(-1), collected


def test_set_get_reset_around_tensor_code_is_one_graph_and_leaves_no_trace():
    setups = [{}, {}, {COLLECT: ["outer"]}, {}]
    _compare(collector_forward, setups, lambda: (torch.randn(3, 4), torch.randn(4, 4)), graphs=1)


def scaled(x):
    return x * SCALE.get() + (1 if MODE.get() == "shift" else 0)


def test_a_value_read_from_the_context_is_guarded():
    setups = [
        {SCALE: 2.0},
        {SCALE: 2.0},
        {SCALE: 3.0},  # recompile
        {SCALE: 3.0, MODE: "shift"},  # recompile
        {SCALE: 3.0},
    ]
    _compare(scaled, setups, lambda: (torch.randn(5),), graphs=3)


def read_default(x):
    value = COLLECT.get()
    return x + 1 if value is None else x * len(value)


def test_an_unset_variable_and_its_default_are_guarded():
    setups = [{}, {}, {COLLECT: [1, 2, 3]}, {COLLECT: [1, 2, 3]}, {}]
    _compare(read_default, setups, lambda: (torch.randn(4),), graphs=2)


def set_and_return_token(x):
    y = x.exp()
    token = SCALE.set(y * 2)
    return y, token


def test_set_without_reset_is_replayed_and_its_token_works_on_later_calls():
    backend = CountingBackend()
    compiled = kiln.compile(set_and_return_token, backend=backend)
    for i in range(4):
        x = torch.randn(3)

        def go(fn, i=i, x=x):
            if i % 2:
                SCALE.set(float(i))
            y, token = fn(x)
            during = SCALE.get()
            SCALE.reset(token)
            return y, during, SCALE.get(ABSENT)

        expected = contextvars.Context().run(go, set_and_return_token)
        got = contextvars.Context().run(go, compiled)
        assert_same(got, expected)
    assert len(backend.graphs) == 1 and backend.runs == 3
    assert compiled._kiln_compiled.eager_reason is None


def nested_sets(x):
    t1 = MODE.set("a")
    t2 = MODE.set("b")
    y = x + 1 if MODE.get() == "b" else x - 1
    MODE.reset(t1)  # back to what the caller had, out of order
    old = t2.old_value
    return y * 2, old


def test_out_of_order_reset_and_token_old_value():
    setups = [{}, {MODE: "shift"}, {}, {MODE: "shift"}]
    _compare(nested_sets, setups, lambda: (torch.randn(3),), graphs=1)


def old_value_of_first_set(x):
    token = MODE.set("inner")
    before = token.old_value
    MODE.reset(token)
    return x + 1 if before == "shift" else x - 1


def test_old_value_of_a_token_is_guarded():
    setups = [{}, {}, {MODE: "shift"}, {MODE: "shift"}]
    _compare(old_value_of_first_set, setups, lambda: (torch.randn(3),), graphs=2)


def break_while_set(x, w):
    collected = []
    token = COLLECT.set(collected)
    try:
        h = _hook(torch.tanh(x @ w))
        s = h.abs().sum().item()  # a graph break while the variable is set
        h = _hook(h * s + 1)
    finally:
        COLLECT.reset(token)
    return h.sum(-1), collected


def test_a_graph_break_while_a_variable_is_set():
    backend = CountingBackend()
    compiled = kiln.compile(break_while_set, backend=backend)
    for setup in [{}, {}, {COLLECT: ["outer"]}]:
        args = (torch.randn(3, 4), torch.randn(4, 4))
        expected, expected_state = _run(break_while_set, setup, args)
        got, got_state = _run(compiled, setup, args)
        assert_same(got, expected)
        assert_same(got_state, expected_state)
    state = compiled._kiln_compiled
    assert state.eager_reason is None, state.eager_reason
    assert len(backend.graphs) == 2  # before and after the break, both reused
    assert backend.runs >= 4
    assert len(state.continuations) == 1


def reset_foreign_token(x, token):
    SCALE.reset(token)
    return x + SCALE.get(-1.0)  # what the token restored: guarded through token.old_value


def test_reset_of_a_token_from_outside_is_replayed_and_what_it_restores_is_guarded():
    backend = CountingBackend()
    compiled = kiln.compile(reset_foreign_token, backend=backend)

    def go(fn, first):
        if first is not None:
            SCALE.set(first)
        token = SCALE.set(2.0)
        out = fn(torch.randn(2), token)
        return out, SCALE.get(ABSENT)

    for first in (1.0, 1.0, None, None, 1.0):
        torch.manual_seed(len(backend.graphs))
        expected = contextvars.Context().run(go, reset_foreign_token, first)
        torch.manual_seed(len(backend.graphs))
        got = contextvars.Context().run(go, compiled, first)
        assert_same(got, expected)
    assert len(backend.graphs) == 2 and backend.runs == 3
    assert not compiled._kiln_compiled.breaks


def test_fullgraph_accepts_context_vars():
    compiled = kiln.compile(collector_forward, backend=CountingBackend(), fullgraph=True)
    x, w = torch.randn(2, 4), torch.randn(4, 4)
    assert_same(_run(compiled, {}, (x, w)), _run(collector_forward, {}, (x, w)))


def test_a_trace_that_stops_early_puts_the_variable_back_before_eager_reruns(monkeypatch):
    from kiln.capture import bytecode

    def uses_a_set_display(x):
        token = MODE.set("inside")
        sizes = {x.dim(), 7}  # BUILD_SET: made unknown to the interpreter below
        MODE.reset(token)
        return x * len(sizes)

    monkeypatch.setitem(bytecode._HANDLERS, "BUILD_SET", bytecode._unknown)
    compiled = kiln.compile(uses_a_set_display, backend=CountingBackend())
    for setup in ({}, {MODE: "shift"}):
        x = torch.randn(3)
        assert_same(_run(compiled, setup, (x,)), _run(uses_a_set_display, setup, (x,)))
    assert "BUILD_SET" in compiled._kiln_compiled.eager_reason
