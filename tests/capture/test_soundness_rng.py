"""Random number generators: a compiled function draws exactly the numbers eager draws, call
after call, and leaves the generators (torch, Python's `random`, NumPy) where eager leaves them.
`torch.manual_seed` inside the function is replayed on every call; kiln never draws from or
resets the user's generators for its own purposes (tracing runs the call once, for real: the
trace must not draw twice).

Each test seeds, runs eager for several calls (recording outputs and one number drawn from
every generator after each call), reseeds and does the same compiled."""

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from harness import CountingBackend, assert_same

import kiln


def _after():
    return torch.rand(2), random.random(), float(np.random.rand())


def _sequence(fn, make_args, calls=4, seed=0):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    args = [make_args() for _ in range(calls)]
    out = []
    for a in args:
        out.append((fn(*a), _after()))
    return out


def _compare(fn, make_args, calls=4, **compile_kwargs):
    torch.manual_seed(99)
    fixed = [make_args() for _ in range(calls)]
    it = iter(fixed)
    expected = _sequence(fn, lambda: next(it), calls)
    compiled = kiln.compile(fn, **compile_kwargs)
    it = iter(fixed)
    got = _sequence(compiled, lambda: next(it), calls)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert_same(g[0], e[0], f"call {i} result")
        assert_same(g[1], e[1], f"generators after call {i}")
    return compiled


def _x():
    return (torch.randn(3, 4),)


def _seeded_inside(x):
    torch.manual_seed(3)
    return x + torch.rand(3, 4), torch.randn(2)


def _seeded_midway(x):
    a = x * torch.rand(3, 4)
    torch.manual_seed(7)
    return a, torch.rand(3, 4) + x, F.dropout(x, 0.5, training=True)


def _random_ops(x):
    return x + torch.rand(3, 4), F.dropout(x, 0.3, training=True), torch.randn_like(x)


def _python_random(x):
    return x * random.random() + random.gauss(0.0, 1.0)


def _numpy_random(x):
    return x * float(np.random.rand()) + torch.from_numpy(np.random.rand(3, 4)).float()


@kiln.disable
def _draw():
    return random.random() + float(np.random.rand())


def _around_disabled(x):
    y = x + torch.rand(3, 4)
    r = _draw()
    return y * r + torch.rand(3, 4)


def _with_break(x):
    a = x + torch.rand(3, 4)
    if a.sum() > 0:  # a data-dependent branch: a graph break
        a = a * torch.randn(3, 4)
    return a + torch.rand(1)


def _state_round_trip(x):
    state = torch.get_rng_state()
    a = torch.rand(3, 4)
    torch.set_rng_state(state)
    return x + a - torch.rand(3, 4), torch.rand(1)


PROGRAMS = [
    _seeded_inside,
    _seeded_midway,
    _random_ops,
    _python_random,
    _numpy_random,
    _around_disabled,
    _with_break,
    _state_round_trip,
]


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("backend", ["counting", "aot_eager"])
def test_random_sequences_match_eager(fn, backend):
    _compare(fn, _x, backend=CountingBackend() if backend == "counting" else backend)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.4)

    def forward(self, x):
        return self.drop(self.lin(x)).relu() + torch.rand_like(x)


def test_module_dropout_in_training_matches_eager_and_its_gradients():
    torch.manual_seed(0)
    eager, compiled_net = _Net(), _Net()
    compiled_net.load_state_dict(eager.state_dict())
    compiled = kiln.compile(compiled_net, backend="aot_eager")
    xs = [torch.randn(5, 4) for _ in range(3)]
    for net, run, seed in [(eager, eager, 5), (compiled_net, compiled, 5)]:
        torch.manual_seed(seed)
        net.outs = []
        for x in xs:
            out = run(x)
            out.sum().backward()
            net.outs.append((out.detach(), net.lin.weight.grad.clone(), torch.rand(1)))
    for g, e in zip(compiled_net.outs, eager.outs):
        assert_same(g, e)


@pytest.mark.parametrize("fn", [_random_ops, _seeded_midway, _with_break], ids=lambda f: f.__name__)
def test_random_sequences_match_eager_with_kilns_code_generator(fn):
    _compare(fn, _x, backend="inductor")
