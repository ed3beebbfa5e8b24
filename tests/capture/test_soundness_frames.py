"""`locals()`, `vars()`, `globals()` and `dir()` inside a compiled function see the frame the
program wrote (its own variables, closure cells read through), not kiln's interpreter."""

import torch
from harness import check, randn, randn2

import kiln

SCALE = 1.5


def _with_locals(x, y):
    z = x * y
    d = locals()
    return d["z"] + d["x"], sorted(d), len(d)


def _with_vars(x):
    a = x + 1
    b = a * 2  # noqa: F841 - read through vars()
    v = vars()
    return v["b"] - v["a"], list(v)


def _helper(t):
    inner = t.sin()
    return locals()


def _inlined_call(x):
    d = _helper(x * 2)
    return d["inner"] + d["t"], list(d)


def _closure_and_cells(x):
    k = 3.0

    def g():
        return k

    d = locals()
    return x * d["k"], sorted(d), d["g"] is g


def _globals_read(x):
    return x * globals()["SCALE"], "SCALE" in dir() or "x" in dir()


def test_locals_in_the_compiled_frame():
    check(_with_locals, randn2(3, 4))


def test_vars_without_argument_is_locals():
    check(_with_vars, randn(5))


def test_locals_of_an_inlined_function():
    check(_inlined_call, randn(4))


def test_locals_reads_closure_cells():
    compiled = kiln.compile(_closure_and_cells)
    for _ in range(3):
        x = torch.randn(3)
        got, expected = compiled(x), _closure_and_cells(x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1:] == expected[1:]


def test_globals_and_dir():
    check(_globals_read, randn(3))


class _Obj:
    def __init__(self):
        self.w = 2.0
        self.b = -1.0


def test_vars_of_an_object_is_its_guarded_dict():
    obj = _Obj()

    def fn(x):
        v = vars(obj)
        return x * v["w"] + v["b"]

    compiled = kiln.compile(fn)
    for w in [2.0, 3.0, -0.5]:
        obj.w = w
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), fn(x))


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        names = sorted(locals())
        return h.relu(), names


def test_locals_in_a_module_forward():
    from harness import check_module

    check_module(_Block, randn(2, 4))
