"""`kiln.compile(model)` with the default backend (`inductor`) end to end on the CPU.

Each test compiles a small model, runs it on fresh random data and compares outputs, gradients
of every parameter and input, and mutated buffers (BatchNorm's running statistics) with eager
PyTorch on a deep copy of the same model. A recorder around `kiln.codegen.compile_graph` checks
that the graphs really went through the code generator (a silent fallback to eager kernels
would make these tests pass for the wrong reason), and that training compiled a forward and a
backward graph.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
import kiln.codegen
from kiln.codegen import CompiledGraph


@pytest.fixture
def compiled_graphs(monkeypatch):
    """Every callable the code generator returned during the test, in order."""
    made: list = []
    real = kiln.codegen.compile_graph

    def recording(gm, example_inputs, *args, **kwargs):
        out = real(gm, example_inputs, *args, **kwargs)
        made.append(out)
        return out

    monkeypatch.setattr(kiln.codegen, "compile_graph", recording)
    kiln.reset()
    yield made
    kiln.reset()


def _assert_generated(made: list, at_least: int) -> None:
    assert len(made) >= at_least, f"{len(made)} graphs compiled, expected >= {at_least}"
    for g in made:
        assert isinstance(g, CompiledGraph), f"a graph ran on eager kernels: {g!r}"
    assert sum(g.kernel_count for g in made) > 0


def _grads(module: nn.Module, *inputs: torch.Tensor) -> list:
    return [p.grad for p in module.parameters()] + [x.grad for x in inputs]


def _train_step_matches(model: nn.Module, make_input, loss_fn, steps: int = 2) -> None:
    """`steps` training steps, each on fresh data: outputs, loss, grads match eager's."""
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model)
    for _ in range(steps):
        x = make_input()
        x_ref = x.detach().clone().requires_grad_(x.requires_grad)
        out, out_ref = compiled(x), ref(x_ref)
        torch.testing.assert_close(out, out_ref)
        loss_fn(out).backward()
        loss_fn(out_ref).backward()
        for g, g_ref in zip(_grads(model, x), _grads(ref, x_ref)):
            assert (g is None) == (g_ref is None)
            if g is not None:
                torch.testing.assert_close(g, g_ref)
        for b, b_ref in zip(model.buffers(), ref.buffers()):
            torch.testing.assert_close(b, b_ref)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)


def test_mlp_inference_and_training(compiled_graphs):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(48, 96), nn.GELU(), nn.Linear(96, 96), nn.SiLU(), nn.Linear(96, 10)
    )
    with torch.no_grad():
        compiled = kiln.compile(model)
        for _ in range(2):
            x = torch.randn(16, 48)
            torch.testing.assert_close(compiled(x), model(x))
    _assert_generated(compiled_graphs, 1)
    before = len(compiled_graphs)
    _train_step_matches(
        model, lambda: torch.randn(16, 48, requires_grad=True), lambda y: (y * y).mean()
    )
    assert len(compiled_graphs) - before >= 2  # forward and backward
    _assert_generated(compiled_graphs, before + 2)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean((2, 3)))


def test_cnn_batchnorm_train_then_eval(compiled_graphs):
    torch.manual_seed(1)
    model = CNN().train()
    _train_step_matches(
        model, lambda: torch.randn(4, 3, 12, 12), lambda y: F.cross_entropy(y, torch.arange(4) % 5)
    )
    _assert_generated(compiled_graphs, 2)
    # running_mean / running_var were updated by the compiled forward exactly as eager does:
    # _train_step_matches compared every buffer after each step.
    model.eval()
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(4, 3, 12, 12)
            torch.testing.assert_close(compiled(x), ref(x))
    for b, b_ref in zip(model.buffers(), ref.buffers()):
        torch.testing.assert_close(b, b_ref)


class Block(nn.Module):
    def __init__(self, d: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.n_head, self.d, self.T = n_head, d, block_size
        mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("bias", mask)

    def forward(self, x):
        T, C, H = self.T, self.d, self.n_head
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(-1, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att.masked_fill(self.bias == 0, float("-inf")), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).contiguous().view(-1, T, C))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab=61, d=32, n_head=4, n_layer=2, block_size=16) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block_size, d)
        self.blocks = nn.ModuleList(Block(d, n_head, block_size) for _ in range(n_layer))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.register_buffer("positions", torch.arange(block_size))

    def forward(self, idx):
        x = self.tok(idx) + self.pos(self.positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _tokens(batch=3, block_size=16, vocab=61):
    return torch.randint(0, vocab, (batch, block_size))


def test_nanogpt_forward(compiled_graphs):
    torch.manual_seed(2)
    model = NanoGPT().eval()
    compiled = kiln.compile(model)
    with torch.no_grad():
        for _ in range(2):
            idx = _tokens()
            torch.testing.assert_close(compiled(idx), model(idx))
    _assert_generated(compiled_graphs, 1)


def test_nanogpt_training_step(compiled_graphs):
    torch.manual_seed(3)
    model = NanoGPT().train()

    def loss(logits):
        targets = torch.randint(0, 61, logits.shape[:2], generator=torch.Generator().manual_seed(7))
        return F.cross_entropy(logits.reshape(-1, 61), targets.reshape(-1))

    _train_step_matches(model, _tokens, loss)
    _assert_generated(compiled_graphs, 2)


def test_codegen_error_falls_back_to_eager_kernels(monkeypatch):
    # A code generator bug must cost speed, never correctness: the graph runs on eager kernels.
    def broken(gm, example_inputs, *args, **kwargs):
        raise RuntimeError("simulated code generator bug")

    monkeypatch.setattr(kiln.codegen, "compile_graph", broken)
    kiln.reset()
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    compiled = kiln.compile(model)
    compiled(torch.randn(4, 8, requires_grad=True))  # the first call traces (runs eagerly)
    x = torch.randn(4, 8, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out = compiled(x)
    torch.testing.assert_close(out, model(x_ref))
    out.sum().backward()
    x_grad = x.grad
    model.zero_grad()
    model(x_ref).sum().backward()
    torch.testing.assert_close(x_grad, x_ref.grad)
    kiln.reset()


@pytest.mark.gpu
def test_nanogpt_training_step_on_cuda(compiled_graphs):
    # On CUDA attention decomposes to the fused efficient-attention kernel, whose backward reads
    # the forward's logsumexp: the training forward must ask for it (it once got an empty one).
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from kiln.bench import suite

    bench = suite.load_models(suite.models_dir())["nanogpt"]  # attention through SDPA
    model, _ = bench.factory("cuda", torch.float32, "small", seed=4)
    model.train()
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model)
    for seed in range(2):
        (idx,) = bench.inputs("cuda", torch.float32, "small", seed=10 + seed)
        out, out_ref = compiled(idx), ref(idx)
        out.square().mean().backward()
        out_ref.square().mean().backward()
        # float32 on the GPU: fused kernels sum in another order than eager's kernels
        torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-5)
        for p, p_ref in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
    _assert_generated(compiled_graphs, 2)
