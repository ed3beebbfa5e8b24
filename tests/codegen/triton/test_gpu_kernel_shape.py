"""The shape of kernels on a device of many short programs (`Capabilities.many_programs`, the
Triton renderer), whatever program makes them: a one-value pointwise is recomputed by its
readers' programs (schedule/realize.py), independent same-size work runs as horizontal parts
(schedule/wide.py), and a mutated input written in place is one kernel argument
(codegen/triton/module.py). Values are eager's on fresh random inputs. Run under Triton's
interpreter on the CPU."""

from __future__ import annotations

import re

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from tr_helpers import fresh_like, require_interpreter

pytestmark = pytest.mark.usefixtures("_interpreter")


@pytest.fixture
def _interpreter():
    require_interpreter()


def _compiled(fn, make, **kw):
    from kiln.codegen import compile_graph_strict

    example = make()
    return compile_graph_strict(make_fx(fn)(*example), example, "cuda", **kw)


def _kernels(compiled) -> dict[str, str]:
    src = compiled.triton_source
    return {
        m.group(1): m.group(0)
        for m in re.finditer(r"def (kernel\d+)\(.*?(?=\n@triton\.jit|\Z)", src, re.S)
    }


def _check(compiled, fn, make, calls=2):
    for _ in range(calls):
        args = make()
        expected = fn(*[a.clone() for a in args])
        for got, want in zip(compiled(list(args)), expected):
            torch.testing.assert_close(got, want)


def test_one_value_producer_is_recomputed_by_its_readers():
    """A costly one-value value read by every element of two tensors (an optimizer's bias
    correction from its step count) was stored by a kernel of one element and loaded by the
    readers; the readers' programs now compute it themselves: no one-value kernel or part."""

    def fn(x, y, t):
        s = torch.sqrt(1 - torch.pow(0.9, t + 1)) + torch.exp(t) * 0.001
        return x / s, y * s

    def make():
        return [torch.randn(5000), torch.randn(4500), torch.rand(()) * 5]

    compiled = _compiled(fn, make)
    kernels = _kernels(compiled)
    assert kernels, compiled.triton_source
    for src in kernels.values():
        assert not re.search(r"xnumel(_p\d+)? = 1\n", src), src
        assert "pow" in src  # (each reader computes it)
    _check(compiled, fn, make)


def test_independent_same_size_work_runs_as_parts():
    """Two independent updates of one size: fusion puts them in one kernel (same-size
    candidates), whose every program computed both, one after the other; split into parts,
    each program computes one."""

    def fn(a, b, c, d):
        return a.exp() * c, b.sin() + d

    def make():
        return [torch.randn(64, 80) for _ in range(4)]

    compiled = _compiled(fn, make)
    kernels = _kernels(compiled)
    assert len(kernels) == 1, kernels
    (src,) = kernels.values()
    parts = re.split(r"\n    if (?:\(gpid >= \d+\) & \()?gpid < \d+\)?:", src)[1:]
    assert len(parts) == 2, src
    for part in parts:
        assert part.count("tl.store(") == 1, part
    _check(compiled, fn, make)


def test_mutated_input_written_in_place_is_one_argument():
    """Each parameter and state tensor of an Adam-like update is read and written through one
    kernel parameter: the kernel takes the 8 tensors, not 8 + 6 (an input and the output
    written into it were two pointers to one memory, and filled the horizontal argument cap)."""

    def fn(p0, p1, g0, g1, m0, m1, v0, v1):
        out = []
        for p, g, m, v in ((p0, g0, m0, v0), (p1, g1, m1, v1)):
            m2 = m.lerp(g, 0.1)
            v2 = v * 0.999 + 0.001 * g * g
            out += [p - 0.01 * m2 / (v2.sqrt() + 1e-8), m2, v2]
        return tuple(out)

    shapes = [(37, 19), (300,)]

    def make():
        return [torch.randn(s) for s in shapes * 3] + [torch.rand(s) for s in shapes]

    mutated = {0: 0, 1: 4, 2: 6, 3: 1, 4: 5, 5: 7}
    compiled = _compiled(fn, make, mutated_inputs=mutated)
    params = [
        [a.strip() for a in args.split(",") if "constexpr" not in a]
        for args in re.findall(r"def kernel\d+\((.*?)\):", compiled.triton_source, re.S)
    ]
    assert sum(map(len, params)) == 8, params
    assert all(len(ps) == len(set(ps)) for ps in params), params
    for _ in range(2):
        args = [fresh_like(t) if i < 6 else fresh_like(t).abs() for i, t in enumerate(make())]
        expected = fn(*[a.clone() for a in args])
        outs = compiled(list(args))
        for j, i in mutated.items():
            assert outs[j] is args[i]
            torch.testing.assert_close(args[i], expected[j])
