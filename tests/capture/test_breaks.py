"""Graph breaks: every cause in every position, compared with eager over several calls, with
the number of graphs asserted.

Programs are generated from templates (a *cause* spliced into a *position*) and registered
with linecache, so break messages can show their source lines. Inputs are positive
(`torch.rand + 0.5`), so data-dependent branches always go the same way and the graph count
is exact: one graph for the work before the break, plus one per continuation entry after it
(a loop whose body breaks runs one continuation entry per iteration value of its counter).
"""

import linecache
import logging
import random
import textwrap

import pytest
import torch
from harness import CountingBackend, assert_same, clone

import kiln

logger = logging.getLogger("kiln.tests.user")


@kiln.disable
def disabled_helper(y):
    return y * 1.25


# causes whose own line does tensor work after the plain-Python step
TRAILING_OPS = {"tensor_branch", "item", "tolist", "unknown_c_function", "bool_of_tensor"}

CAUSES = {
    "tensor_branch": "if y.sum() > 0:\n    y = y * 2\nelse:\n    y = y - 1",
    "item": "y = y * (y.sum().item() > 0)",
    "tolist": "y = y + len([v for v in y.flatten().tolist() if v > 0])",
    "print_tensor": "print('total', y.sum())",
    "unknown_c_function": "y = y * (1.0 + 0.0 * random.random())",
    "kiln_disable": "y = disabled_helper(y)",
    "bool_of_tensor": "y = y * 2 if bool((y > 0).all()) else y",
}

POSITIONS = {
    # template, graphs before the break, continuation graphs (None: see expected_graphs)
    "top_level": (
        """
        def prog(x):
            y = x * 1.5
            {cause}
            return y + 1
        """,
        1,
        1,
    ),
    "inlined_call": (
        """
        def inner(y):
            y = y.cos() + 1
            {cause}
            return y * 3
        def prog(x):
            return inner(x + 1) - 2
        """,
        1,
        1,
    ),
    "for_loop": (
        """
        def prog(x):
            y = x
            for i in range(3):
                y = y + i
                {cause}
            return y
        """,
        1,
        None,
    ),
    "no_grad_block": (
        """
        def prog(x):
            y = x * 2
            with torch.no_grad():
                y = y + 1
                {cause}
            return y * y, torch.is_grad_enabled()
        """,
        1,
        1,
    ),
    "autocast_block": (
        """
        def prog(x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = x @ x.t()
                {cause}
            return y.float() + 1
        """,
        1,
        1,
    ),
    "try_block": (
        """
        def prog(x):
            y = x - 0.25
            try:
                y = y * 2
                {cause}
            except ValueError:
                y = y * 0
            return y
        """,
        1,
        None,
    ),
    "method_call": (
        """
        class Holder:
            scale = 2.0
            def run(self, y):
                y = y * self.scale
                {cause}
                return y.exp()
        def prog(x):
            return Holder().run(x + 1)
        """,
        1,
        1,
    ),
    "nested_calls": (
        """
        def deepest(y):
            y = y + 0.5
            {cause}
            return y
        def middle(y):
            return deepest(y * 2) + 1
        def prog(x):
            return middle(x).sum(0)
        """,
        1,
        1,
    ),
}

_counter = [0]


def build(position: str, cause: str):
    template, before, after = POSITIONS[position]
    body = textwrap.dedent(template)
    lines = body.splitlines()
    out = []
    for line in lines:
        if "{cause}" in line:
            indent = line[: len(line) - len(line.lstrip())]
            out += [indent + c for c in CAUSES[cause].splitlines()]
        else:
            out.append(line)
    source = "\n".join(out) + "\n"
    _counter[0] += 1
    filename = f"<kiln-break-{position}-{cause}-{_counter[0]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = {"torch": torch, "random": random, "logger": logger, "disabled_helper": disabled_helper}
    exec(compile(source, filename, "exec"), scope)
    return scope["prog"], before + expected_after(position, cause, after)


def expected_after(position: str, cause: str, after):
    """Graphs after the break. A loop body that breaks runs one continuation entry per value
    of its counter (0, 1, 2); the last one has tensor work only if the cause has. After a
    `try` block the function just returns, so only the cause's own work makes a graph."""
    trailing = cause in TRAILING_OPS
    if position == "for_loop":
        return 3 if trailing else 2
    if position == "try_block":
        return 1 if trailing else 0
    return after


def run_case(prog, graphs: int, make_args, calls: int = 3):
    backend = CountingBackend()
    compiled = kiln.compile(prog, backend=backend)
    for _ in range(calls):
        args = make_args()
        eager_args = clone(args)
        random.seed(7)
        expected = prog(*eager_args)
        random.seed(7)
        got = compiled(*args)
        assert_same(got, expected)
    state = compiled._kiln_compiled
    assert state.eager_reason is None, state.eager_reason
    assert state.breaks, "expected a graph break"
    assert len(backend.graphs) == graphs, f"expected {graphs} graphs, got {len(backend.graphs)}"
    return compiled, backend


def _args(position):
    if position == "autocast_block":
        return lambda: (torch.rand(4, 4) + 0.5,)
    if position == "no_grad_block":
        return lambda: (torch.rand(2, 3) + 0.5,)
    return lambda: (torch.rand(2, 3) + 0.5,)


@pytest.mark.parametrize("cause", sorted(CAUSES))
@pytest.mark.parametrize("position", sorted(POSITIONS))
def test_break(position, cause, capsys):
    prog, graphs = build(position, cause)
    run_case(prog, graphs, _args(position))


def test_break_with_requires_grad_keeps_autograd():
    prog, graphs = build("top_level", "item")
    x = torch.rand(3, requires_grad=True)
    cf = kiln.compile(prog, backend="eager")
    for _ in range(2):
        cf(x).sum().backward()
    ref = x.detach().clone().requires_grad_(True)
    for _ in range(2):
        prog(ref).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)


def test_both_sides_of_a_branch_get_their_own_continuation():
    def f(x):
        y = x * 2
        if y.sum() > 0:
            y = y + 1
        else:
            y = y - 1
        return y.abs()

    backend = CountingBackend()
    cf = kiln.compile(f, backend=backend)
    for sign in (1, 1, -1, -1, 1):
        x = (torch.rand(3) + 0.1) * sign
        torch.testing.assert_close(cf(x), f(x))
    assert len(backend.graphs) == 3


def test_multiple_breaks_in_sequence():
    def f(x):
        a = x + 1
        n = int(a.sum().item() > 0)
        b = a * n
        print("mid", b.sum())
        c = b - 1
        if c.mean() > -100:
            c = c * 3
        return c

    run_case(f, 4, lambda: (torch.rand(5),))


def test_break_inside_module_forward():
    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            if y.abs().sum() > 0:
                y = y.relu()
            return y

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Inner(), Inner()

        def forward(self, x):
            return self.b(self.a(x) + 1) * 2

    mod = Outer()
    backend = CountingBackend()
    cm = kiln.compile(mod, backend=backend)
    for _ in range(3):
        x = torch.randn(2, 4)
        torch.testing.assert_close(cm(x), mod(x))
    # a.lin | a.relu + 1 + b.lin | b.relu * 2
    assert len(backend.graphs) == 3
    assert cm._kiln_compiled.eager_reason is None


def test_fullgraph_names_file_line_and_source_of_generated_program():
    prog, _ = build("inlined_call", "item")
    cf = kiln.compile(prog, backend="eager", fullgraph=True)
    with pytest.raises(Exception) as err:
        cf(torch.rand(2, 3))
    msg = str(err.value)
    assert "kiln-break-inlined_call-item" in msg and "y.sum().item()" in msg
    assert "Tensor.item" in msg and "hint:" in msg


def test_graph_break_log_prints_each_break_once():
    records = []

    class ListHandler(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    prog, _ = build("for_loop", "print_tensor")
    target = logging.getLogger("kiln.graph_breaks")
    handler = ListHandler(level=logging.DEBUG)
    target.addHandler(handler)
    old_level = target.level
    target.setLevel(logging.INFO)  # whatever other tests left on the `kiln` logger
    kiln.set_logs("graph_breaks")
    try:
        cf = kiln.compile(prog, backend="eager")
        for _ in range(3):
            cf(torch.rand(2, 3))
    finally:
        kiln.set_logs()
        target.removeHandler(handler)
        target.setLevel(old_level)
    msgs = [m for m in records if "graph break" in m]
    assert len(msgs) == 1, msgs
    assert "print() of a tensor" in msgs[0] and "print('total', y.sum())" in msgs[0]


def test_unresumable_break_falls_back_correctly():
    # a break inside a generator consumed by native sum(): no way to resume mid-generator
    def f(x):
        return sum(t * (t.sum().item() > 0) for t in (x, x + 1))

    cf = kiln.compile(f, backend="eager")
    for _ in range(3):
        x = torch.rand(3)
        torch.testing.assert_close(cf(x), f(x))
    assert cf._kiln_compiled.eager_reason is not None
