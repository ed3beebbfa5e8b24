"""Compiled optimizer steps: `kiln.compile(opt.step)` and `opt.step()` inside a compiled training
function give eager's parameters and optimizer state, step after step.

The reference runs torch's optimizer eagerly with `torch.compiler.is_compiling()` answering True:
the code path torch's optimizers take under a compiler (the step count stays a tensor, so bias
corrections are computed in the step tensor's dtype rather than from a Python float), which is
the code kiln traces. Float32 parameters are also compared with plain eager at the default
tolerance; a float64 parameter differs from plain eager by that float32 step count alone.
"""

from __future__ import annotations

import re
from unittest import mock

import pytest
import torch

import kiln
from kiln import logs
from kiln.backends.builtin import fallbacks, inductor

OPTIMIZERS = {
    "sgd": lambda ps, fe: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=fe),
    "adam": lambda ps, fe: torch.optim.Adam(ps, lr=0.05, foreach=fe),
    "adamw": lambda ps, fe: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1, foreach=fe),
    "sgd_nesterov": lambda ps, fe: torch.optim.SGD(
        ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=fe
    ),
    "adam_amsgrad": lambda ps, fe: torch.optim.Adam(
        ps, lr=0.05, weight_decay=0.1, amsgrad=True, foreach=fe
    ),
    "adamw_amsgrad": lambda ps, fe: torch.optim.AdamW(ps, lr=0.05, amsgrad=True, foreach=fe),
}


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    shapes = [((6, 5), torch.float32), ((5,), torch.float32), ((3, 4), torch.float64)]
    return [torch.nn.Parameter(torch.randn(s, generator=g, dtype=d)) for s, d in shapes]


def _compiling_eager_step(opt) -> None:
    with mock.patch("torch.compiler.is_compiling", return_value=True):
        opt.step()


def _assert_same_state(ref_opt, ref_params, opt, params, only_float32=False) -> None:
    for a, b in zip(ref_params, params):
        if only_float32 and a.dtype != torch.float32:
            continue
        torch.testing.assert_close(b, a)
        assert set(opt.state[b]) == set(ref_opt.state[a])
        for k, v in ref_opt.state[a].items():
            torch.testing.assert_close(opt.state[b][k], v, msg=lambda m, k=k: f"state {k}: {m}")


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_step_matches_eager(name, foreach):
    ref, plain, got = _params(0), _params(0), _params(0)
    make = OPTIMIZERS[name]
    ref_opt, plain_opt, opt = make(ref, foreach), make(plain, foreach), make(got, foreach)
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return inductor(gm, example_inputs)

    fell_back = fallbacks()
    step = kiln.compile(opt.step, backend=counting, fullgraph=True)
    for _ in range(4):
        for a, b, c in zip(ref, plain, got):
            g = torch.randn_like(a)
            a.grad, b.grad, c.grad = g.clone(), g.clone(), g.clone()
        _compiling_eager_step(ref_opt)
        plain_opt.step()
        step()
        _assert_same_state(ref_opt, ref, opt, got)
        _assert_same_state(plain_opt, plain, opt, got, only_float32=True)
    # the first step creates the state (one graph), every later one runs a second graph
    assert len(graphs) == 2
    assert fallbacks() == fell_back  # kiln's code ran every graph, not eager kernels


def test_step_compiles_after_torch_compile_patched_optimizers():
    """TorchDynamo, once it has run, wraps every optimizer's `_init_group` in its `disable`:
    kiln still traces the step whole."""
    from torch._dynamo.eval_frame import TorchPatcher

    TorchPatcher.patch()
    test_compiled_step_matches_eager("adam", True)


def test_step_skips_parameters_without_grad():
    ref, got = _params(1), _params(1)
    ref_opt, opt = OPTIMIZERS["adam"](ref, True), OPTIMIZERS["adam"](got, True)
    step = kiln.compile(opt.step)
    for i in range(4):
        for k, (a, b) in enumerate(zip(ref, got)):
            g = torch.randn_like(a)
            # parameter 1 has no gradient on the third step: a different graph, eager's result
            a.grad, b.grad = (None, None) if (i == 2 and k == 1) else (g.clone(), g.clone())
        _compiling_eager_step(ref_opt)
        step()
        _assert_same_state(ref_opt, ref, opt, got)


def test_training_function_with_step_inside():
    def make():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        return m, torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True)

    def train_step(model, opt, x, y):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    ref_model, ref_opt = make()
    model, opt = make()
    compiled = kiln.compile(train_step)
    for _ in range(5):
        x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
        with mock.patch("torch.compiler.is_compiling", return_value=True):
            expected = train_step(ref_model, ref_opt, x, y)
        torch.testing.assert_close(compiled(model, opt, x, y), expected)
        _assert_same_state(ref_opt, list(ref_model.parameters()), opt, list(model.parameters()))


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_lr_scheduler_changes_lr_every_step_without_recompiling(name, foreach):
    """A LambdaLR writes a new `group["lr"]` every step: the second trace makes it a graph
    input (a 0-d tensor by the time the graph runs), and the later steps reuse that entry."""
    ref, got = _params(2)[:2], _params(2)[:2]
    ref_opt, opt = OPTIMIZERS[name](ref, foreach), OPTIMIZERS[name](got, foreach)
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, lambda s: 0.9**s)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return inductor(gm, example_inputs)

    fell_back = fallbacks()
    step = kiln.compile(opt.step, backend=counting)  # the scheduler's wrapper of opt.step
    for _ in range(10):
        for a, b in zip(ref, got):
            g = torch.randn_like(a)
            a.grad, b.grad = g.clone(), g.clone()
        _compiling_eager_step(ref_opt)
        step()
        ref_sched.step()
        sched.step()
        _assert_same_state(ref_opt, ref, opt, got)
    # the first step (state created), the second (state read, lr seen to change): no more
    assert len(graphs) == 2
    assert fallbacks() == fell_back


def test_lr_read_beyond_item_access_is_guarded_by_value():
    """A dynamic float that reaches code kiln does not follow (`dict(group)`) is specialized:
    a new value compiles again instead of reusing a graph that baked the old one in."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm

    def f(x, group):
        scaled = x * group["lr"]
        copy = dict(group)  # natively: the values as plain numbers
        return scaled + copy["lr"]

    compiled = kiln.compile(f, backend=counting)
    x = torch.randn(5)
    for lr in (0.5, 0.25, 0.125, 0.125):
        group = {"lr": lr, "momentum": 0.9}
        torch.testing.assert_close(compiled(x, group), f(x, group))
    assert len(graphs) == 3  # 0.5, 0.25 (now dynamic, but specialized by dict()), 0.125


def _logged(fn) -> str:
    """The output_code + schedule log of `fn()`."""
    with logs.captured("output_code", "schedule") as buf:
        fn()
    return buf.getvalue()


def _steady_step_code(n_params: int, name: str = "adamw") -> str:
    """The output_code log of the second compiled step (state exists) over `n_params`
    parameters of four shapes."""
    shapes = [(33, 17), (17,), (17, 51), (51,)]
    torch.manual_seed(n_params)
    params = [torch.nn.Parameter(torch.randn(shapes[i % 4])) for i in range(n_params)]
    opt = OPTIMIZERS[name](params, True)
    step = kiln.compile(opt.step)
    for p in params:
        p.grad = torch.randn_like(p)
    step()  # creates the state: the first graph
    return _logged(step)


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_step_runs_few_kernels_whatever_the_number_of_parameters(name):
    """The per-parameter updates of a foreach step fuse into one kernel per parameter shape
    (not one per parameter and op), and every parameter and state tensor is written in place."""
    counts = {}
    for n in (8, 24):
        code = _steady_step_code(n, name)
        counts[n] = len(re.findall(r'extern "C" void kernel\d+', code))
        assert "aten_" not in code.split("wrapper:")[-1]  # no ATen call left in the wrapper
        # each parameter and its state: (param, step, exp_avg, exp_avg_sq) / (param, buf)
        assert code.count("is written into input") == n * {"adamw": 4, "sgd": 2}[name]
        assert "not written into input" not in code
    assert counts[8] == counts[24] <= 10, counts


def _distinct_shapes(n: int) -> list[tuple[int, ...]]:
    """`n` parameter shapes, no two of one size: matrices and vectors of growing sizes."""
    return [(3 + i, 2 + 2 * i) if i % 2 else (5 + 7 * i,) for i in range(n)]


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name", ["sgd_nesterov", "adam", "adamw_amsgrad"])
def test_step_over_many_shapes_is_a_few_kernels_and_matches_eager(name, foreach):
    """Horizontal fusion (schedule/horizontal.py): the per-shape kernels of a step become a few
    kernels, as many for 5 parameters of 5 sizes as for 15 of 15 sizes; the values stay
    eager's, step after step; single-tensor steps too (their step counts' increments and bias
    corrections make one kernel of one-value members ahead of the per-parameter updates,
    fusion.py, which then group as a foreach step's do)."""
    counts = {}
    for n in (5, 15):
        g = torch.Generator().manual_seed(n)
        ref = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in _distinct_shapes(n)]
        got = [torch.nn.Parameter(p.detach().clone()) for p in ref]
        ref_opt, opt = OPTIMIZERS[name](ref, foreach), OPTIMIZERS[name](got, foreach)
        step = kiln.compile(opt.step, fullgraph=True)
        for i in range(3):
            for a, b in zip(ref, got):
                a.grad = torch.randn_like(a)
                b.grad = a.grad.clone()
            _compiling_eager_step(ref_opt)
            if i == 1:  # the steady graph (the state exists) compiles here
                code = _logged(step)
            else:
                step()
            _assert_same_state(ref_opt, ref, opt, got)
        counts[n] = len(re.findall(r'extern "C" void kernel\d+', code))
    assert counts[5] == counts[15] <= 4, counts
