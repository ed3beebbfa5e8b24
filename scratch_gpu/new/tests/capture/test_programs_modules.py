"""Programs built from nn.Modules, dataclasses, namedtuples, context managers, inlined calls
(methods, super, properties, static/class methods, partial, *args/**kwargs, recursion) and
state mutation that must be replayed (in-place input ops, buffers, attributes, containers)."""

import dataclasses
import functools
from collections import namedtuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from harness import check, check_module, randn, randn2

Pair = namedtuple("Pair", ["a", "b"])


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    aux: float


@dataclasses.dataclass
class Cfg:
    scale: float = 2.0
    bias: bool = True


class MLP(nn.Module):
    def __init__(self, d=8, hidden=16):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.fc2(F.gelu(self.fc1(x))))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(6, 6) for _ in range(3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(6, 2), "b": nn.Linear(6, 3)})
        self.seq = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Dropout(0.0))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = x + layer(x) * (i + 1)
        x = self.seq(x)
        return {k: h(x) for k, h in self.heads.items()}, len(self.layers)


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x)

    @property
    def scale(self):
        return 0.5

    @staticmethod
    def act(x):
        return torch.tanh(x)

    @classmethod
    def offset(cls):
        return 1.0


class Child(Base):
    def forward(self, x):
        y = super().forward(x)
        return self.act(y) * self.scale + self.offset()


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("running", torch.zeros(4))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        self.running.mul_(0.9).add_(x.mean(0).detach() * 0.1)
        return self.lin(x) - self.running


class TrainFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            return y * 2
        return y - 1


class BN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class Attn(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).contiguous().view(b, t, d))


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attn(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=50, d=16, n=2, t=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(t, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class KwModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, *extra, scale=1.0, **opts):
        y = self.lin(x) * scale
        for e in extra:
            y = y + e
        if opts.get("square"):
            y = y * y
        return y


class Recursive(nn.Module):
    def forward(self, x):
        return self.go(x, 3)

    def go(self, x, n):
        if n == 0:
            return x
        return self.go(x * 1.1 + n, n - 1)


class DataOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.cfg = Cfg()

    def forward(self, x):
        y = self.lin(x) * self.cfg.scale
        return Out(logits=y, aux=self.cfg.scale + 1), Pair(y.sum(), x.mean())


class CallableHelper:
    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return x * self.k


class UsesHelper(nn.Module):
    def __init__(self):
        super().__init__()
        self.helper = CallableHelper(3.0)
        self.partial = functools.partial(torch.clamp, min=-0.5)

    def forward(self, x):
        return self.partial(self.helper(x), max=0.5)


class DictHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(3, 3), "b": nn.Linear(3, 2)})
        self.table = {"k": nn.Linear(3, 3)}  # a plain dict holding a module

    def forward(self, x):
        return self.heads["a"](x) + self.table["k"](x).sum() + self.heads["b"](x).mean()


MODULES = {
    "moduledict_and_dict_indexing": (DictHeads, randn(2, 3)),
    "mlp": (MLP, randn(3, 8)),
    "module_containers": (Stack, randn(2, 6)),
    "super_property_static": (Child, randn(2, 4)),
    "buffer_update": (WithBuffer, randn(3, 4)),
    "training_flag": (TrainFlag, randn(2, 5)),
    "conv_bn_train": (BN, randn(2, 3, 6, 6)),
    "attention": (Attn, randn(2, 8, 16)),
    "transformer_block": (Block, randn(2, 8, 16)),
    "tiny_gpt": (TinyGPT, lambda: (torch.randint(0, 50, (2, 8)),)),
    "kwargs_module": (KwModule, randn(2, 3)),
    "recursion": (Recursive, randn(3)),
    "dataclass_namedtuple_out": (DataOut, randn(3, 4)),
    "callable_object_partial": (UsesHelper, randn(4)),
    "embedding_bag": (
        lambda: nn.EmbeddingBag(10, 4, mode="mean"),
        lambda: (torch.randint(0, 10, (3, 5)),),
    ),
    "rnn_cell": (lambda: nn.GRUCell(4, 6), randn(2, 4)),
    "conv_pool": (
        lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.MaxPool2d(2), nn.Flatten()),
        randn(2, 2, 8, 8),
    ),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module(name):
    make, make_args = MODULES[name]
    check_module(make, make_args)


def test_module_eval_mode_bn():
    check_module(BN, randn(2, 3, 5, 5), train=False)


def test_module_kwargs_and_varargs():
    torch.manual_seed(0)
    mod = KwModule()
    from harness import CountingBackend

    import kiln

    backend = CountingBackend()
    cm = kiln.compile(mod, backend=backend)
    for _ in range(3):
        x, e = torch.randn(2, 3), torch.randn(2, 3)
        torch.testing.assert_close(
            cm(x, e, scale=2.0, square=True), mod(x, e, scale=2.0, square=True)
        )
    assert len(backend.graphs) == 1


def test_forward_hooks_run_and_are_guarded():
    from harness import CountingBackend

    import kiln

    mod = MLP()

    def pre(m, args):
        return (args[0] * 2,)

    def post(m, args, out):
        return out + 1

    mod.fc1.register_forward_pre_hook(pre)
    handle = mod.register_forward_hook(post)
    backend = CountingBackend()
    cm = kiln.compile(mod, backend=backend)
    x = torch.randn(2, 8)
    torch.testing.assert_close(cm(x), mod(x))
    torch.testing.assert_close(cm(x), mod(x))
    assert len(backend.graphs) == 1
    handle.remove()  # removing a hook changes behaviour: the guard must notice
    torch.testing.assert_close(cm(x), mod(x))
    assert len(backend.graphs) == 2


# ---- functions: inlining features --------------------------------------------------------
def _defaults(x, a=2, *rest, b=3, **kw):
    return x * a + b + sum(rest) + kw.get("c", 0)


FUNCS = {
    "defaults_varargs": (lambda x, y: _defaults(x, 1, 2, 3, b=4, c=5) + _defaults(y), randn2(3)),
    "star_call": (lambda x, y: _defaults(*[x, 2], **{"b": 1}), randn2(3)),
    "partial": (lambda x, y: functools.partial(_defaults, a=3)(x) + y, randn2(3)),
    "lambda_inline": (lambda x, y: (lambda t, s=2: t * s)(x) + y, randn2(3)),
    "recursion_fn": (lambda x, y: _fact(x, 4), randn2(3)),
    "method_on_object": (lambda x, y: CallableHelper(2.0)(x) + y, randn2(3)),
    "namedtuple_in": (
        lambda p, y: p.a * p.b + y,
        lambda: (Pair(torch.randn(2), torch.randn(2)), torch.randn(2)),
    ),
    "namedtuple_out": (lambda x, y: Pair(x + 1, y * 2), randn2(2)),
    "dataclass_in": (
        lambda c, x: x * c.scale + (1 if c.bias else 0),
        lambda: (Cfg(), torch.randn(3)),
    ),
    "dataclass_out": (lambda x, y: Out(logits=x @ y, aux=0.5), randn2(3, 3)),
    "generator_fn": (lambda x, y: sum(_gen(x, 3)), randn2(3)),
    "generator_zip": (lambda x, y: [a * b for a, b in zip(_gen(x, 2), _gen(y, 2))], randn2(3)),
    "contextlib_cm": (lambda x, y: _with_cm(x, y), randn2(3)),
    "try_except_no_raise": (lambda x, y: _try(x, y), randn2(3)),
    "try_except_raises_python": (lambda x, y: _try_raise(x), randn2(3)),
    "try_finally": (lambda x, y: _try_finally(x), randn2(3)),
    "with_user_cm": (lambda x, y: _with_user(x), randn2(3)),
}


def _fact(x, n):
    return x if n <= 1 else _fact(x * n, n - 1)


def _gen(x, n):
    for i in range(n):
        yield x * i


import contextlib  # noqa: E402


@contextlib.contextmanager
def _scaled():
    yield 3.0


def _with_cm(x, y):
    with _scaled() as s:
        z = x * s
    return z + y


def _try(x, y):
    try:
        z = x + y
    except RuntimeError:
        z = x - y
    return z


def _try_raise(x):
    try:
        {}["missing"]
    except KeyError as e:
        return x * len(str(e))
    return x


def _try_finally(x):
    out = [x]
    try:
        out.append(x * 2)
    finally:
        out.append(x * 3)
    return out


class _Tracker:
    def __enter__(self):
        self.k = 2.0
        return self

    def __exit__(self, *exc):
        return False


def _with_user(x):
    with _Tracker() as t:
        x = x * t.k
    return x


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_function(name):
    fn, make_args = FUNCS[name]
    check(fn, make_args)


# ---- grad mode and autocast -------------------------------------------------------------
def _no_grad_inside(x, w):
    with torch.no_grad():
        y = x @ w
    return y + x.sum(), y.requires_grad


@torch.no_grad()
def _no_grad_decorated(x, w):
    return x @ w


def _enable_grad_inside(x, w):
    with torch.no_grad():
        with torch.enable_grad():
            y = (x * w).sum()
    return y


def _autocast_inside(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
    return y.float() + 1, y.dtype


def _set_grad_enabled(x, w):
    with torch.set_grad_enabled(False):
        a = x * w
    return a, x * 2


def _grad_args():
    return (torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True))


@pytest.mark.parametrize(
    "fn",
    [_no_grad_inside, _no_grad_decorated, _enable_grad_inside, _autocast_inside, _set_grad_enabled],
)
def test_grad_mode_and_autocast(fn):
    check(fn, _grad_args)
    assert torch.is_grad_enabled()
    assert not torch.is_autocast_enabled("cpu")


def test_gradients_flow_through_compiled_graph():
    import kiln

    mod = MLP()
    twin = MLP()
    twin.load_state_dict(mod.state_dict())
    cm = kiln.compile(mod, backend="eager")
    for _ in range(2):
        x = torch.randn(4, 8)
        cm(x).square().sum().backward()
        twin(x).square().sum().backward()
    for (n, p), q in zip(mod.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


# ---- mutation replayed on later calls ---------------------------------------------------
def _inplace_input(x, y):
    x.add_(y)
    y[0] = 1.5
    return x * 2


def _list_append(xs, y):
    xs.append(y * 2)
    return len(xs)


def _dict_store(d, y):
    d["out"] = y + 1
    d.pop("drop", None)
    return y * 3


@pytest.mark.parametrize(
    "fn,make_args",
    [
        (_inplace_input, randn2(4)),
        (_list_append, lambda: ([torch.randn(2)], torch.randn(2))),
        (_dict_store, lambda: ({"drop": 1, "keep": torch.randn(2)}, torch.randn(2))),
    ],
)
def test_mutation_replayed(fn, make_args):
    check(fn, make_args)


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.cache = None
        self.calls = []

    def forward(self, x):
        y = self.lin(x)
        self.cache = y.detach()
        self.calls.append("fwd")
        return y


def test_attribute_and_list_side_effects_replayed():
    import kiln

    mod = Counter()
    twin = Counter()
    twin.load_state_dict(mod.state_dict())
    cm = kiln.compile(mod, backend="eager")
    for _ in range(3):
        x = torch.randn(3, 2)
        torch.testing.assert_close(cm(x), twin(x))
        torch.testing.assert_close(mod.cache, twin.cache)
        assert mod.calls == twin.calls
    assert cm._kiln_compiled.eager_reason is None


def test_print_is_replayed(capsys):
    import kiln

    def f(x):
        print("step", 3, "ok")
        return x * 2

    cf = kiln.compile(f, backend="eager")
    for _ in range(3):
        cf(torch.randn(2))
    assert capsys.readouterr().out.count("step 3 ok") == 3
    assert cf._kiln_compiled.eager_reason is None


@pytest.mark.parametrize("mod_cls", [Stack, TinyGPT])
def test_parameters_are_graph_inputs_not_constants(mod_cls):
    """Parameters reached through enumerate/zip/iteration over module containers must be lifted
    as graph inputs (guarded), never frozen into the graph as constants."""
    from harness import CountingBackend

    import kiln

    mod = mod_cls()
    backend = CountingBackend()
    cm = kiln.compile(mod, backend=backend)
    x = torch.randn(2, 6) if mod_cls is Stack else torch.randint(0, 50, (2, 8))
    cm(x)
    gm = backend.graphs[0]
    assert not [n for n in gm.graph.nodes if n.op == "get_attr"], gm.code
    n_inputs = len(gm.graph.find_nodes(op="placeholder"))
    assert n_inputs == 1 + len(list(mod.parameters())) + len(list(mod.buffers()))
