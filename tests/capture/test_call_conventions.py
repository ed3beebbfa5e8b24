"""Bytecode whose shape differs between Python versions, compiled as one graph on each.

3.13 moved the NULL of the call convention above the callable, turned keyword calls into
CALL_KW, built closures with SET_FUNCTION_ATTRIBUTE, converted branch conditions with TO_BOOL
and fused local loads and stores; 3.12 added LOAD_SUPER_ATTR and method-form LOAD_ATTR. These
programs hit each of those on whichever Python runs them and compare with eager.
"""

from __future__ import annotations

import torch
from harness import check, randn, randn2


class _Scaler:
    def __init__(self, f: float) -> None:
        self.f = f

    def scale(self, x, f=1.0, *, shift=0.0):
        return x * self.f * f + shift

    @staticmethod
    def twice(x):
        return x * 2


def test_calls_of_globals_methods_and_locals_with_positional_and_keyword_arguments():
    s = _Scaler(1.5)

    def fn(x, y):
        g = torch.add  # a local callable: PUSH_NULL beside it
        a = torch.clamp(x, min=-0.5, max=0.5)  # a global's attribute with keywords
        b = s.scale(y, 2.0, shift=0.25)  # method form with a keyword (CALL_KW on 3.13)
        c = s.twice(x)  # a staticmethod through an instance
        d = g(a, b, alpha=0.5)
        return d + c + x.sum(dim=0, keepdim=True)

    check(fn, randn2(4, 3), fullgraph=True)


def test_star_calls_of_functions_and_methods():
    s = _Scaler(0.75)

    def fn(x, y):
        args = (x, 3.0)
        kwargs = {"shift": 1.0}
        a = s.scale(*args, **kwargs)  # CALL_FUNCTION_EX on a method
        b = torch.stack(*[[x, y]], **{"dim": 1})
        c = torch.mul(*(y, 2))
        return a.sum() + b.sum(dim=1) + c

    check(fn, randn2(5), fullgraph=True)


def test_closures_with_defaults_keyword_defaults_and_annotations():
    def fn(x):
        k = x.mean()

        def inner(y, a: float = 1.5, *, b: int = 3) -> torch.Tensor:
            return y * k + a * b

        lam = lambda y, c=2.0: inner(y, c, b=1) - k  # noqa: E731
        return inner(x) + inner(x, 0.5, b=2) + lam(x)

    check(fn, randn(6), fullgraph=True)


class _Base(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 2


class _Child(_Base):
    def forward(self, x):
        return super().forward(x) + super(_Child, self).forward(-x)


def test_zero_and_two_argument_super():
    from harness import check_module

    check_module(_Child, randn(3, 4), fullgraph=True)


def test_fused_local_loads_and_stores_and_a_local_deleted_then_set_again():
    def fn(x, y):
        a, b = x, y
        a, b = b, a  # STORE_FAST_STORE_FAST on 3.13
        t = a * b  # LOAD_FAST_LOAD_FAST
        del t
        t = a - b  # LOAD_FAST_CHECK after the del
        return t + a, b

    check(fn, randn2(3, 2), fullgraph=True)


def test_format_strings_with_conversions_and_specs_key_a_dict():
    def fn(x):
        scales = {"n=4 'w' 1.50": 2.0}
        key = f"n={x.shape[0]} {'w'!r} {1.5:.2f}"
        return x * scales[key] + len(f"{x.dim()!s:>3}")

    check(fn, randn(4), fullgraph=True)


def test_a_tensor_condition_breaks_the_graph_at_the_branch():
    def fn(x):
        if x.abs().sum() > 0:  # COMPARE_OP then TO_BOOL (3.13) then the jump; always taken
            x = x + 1
        else:
            x = x - 1
        torch._assert(x.abs().sum() >= 0, "never fails")  # an `assert` inside torch
        return x * 3

    check(fn, randn(5), graphs=3)
