"""Memory of a whole compiled training step (forward with the loss, backward, a compiled AdamW
step, `zero_grad`) against eager's on the same model and data: the most bytes alive at once and
the bytes still alive when the step is over, counted by a dispatch mode over every tensor the
step makes (and the arena blocks compiled graphs keep between calls), on every step from the
first (the traced one) on, with eager's losses and parameters. The first step is the trace,
eager's ops on eager's values: its peak is eager's within FIRST_MARGIN; the compiled steps after
it peak no higher than eager's at all, and end holding what eager's hold."""

from __future__ import annotations

import copy
import gc
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.bench.live_bytes import LiveBytes
from kiln.runtime.arenas import held_bytes

# What the first step (the trace) may hold above eager's peak: a hundredth. It runs eager's ops
# on eager's values, so only what the trace keeps a little longer than eager does (measured:
# 32 KiB of 12.5 MiB on the HF model, nothing on the MLP); every fault this test guards against
# is one or more logits-sized tensors (4 MiB here, a third of the peak).
FIRST_MARGIN = 0.01
# What a step may keep beyond eager's after zero_grad: a few scalars (a compiled graph's
# constants, made when it is compiled).
SCALARS = 64


def _real(t) -> bool:
    """A tensor with memory: not the meta tensors a trace keeps as its graph's example values,
    nor the fake ones of the compile's tracing."""
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta"


def _mlp(vocab: int):
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, vocab)
    )

    def batch(tokens):
        return torch.randn(tokens, 32), torch.randint(0, vocab, (tokens,))

    return model, batch, lambda m, x, y: F.cross_entropy(m(x), y)


def _hf_gpt2(vocab: int):  # the loss inside the model (`labels=`), shifted, upcast, reduced
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=1,
        n_embd=32,
        n_head=2,
        vocab_size=vocab,
        n_positions=64,
        bos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,  # eager's and kiln's steps see one RNG
    )
    cfg.loss_type = "ForCausalLM"
    model = transformers.GPT2LMHeadModel(cfg)
    model.config.use_cache = False

    def batch(tokens):
        ids = torch.randint(0, vocab, (2, tokens // 2))
        return ids, ids

    return model, batch, lambda m, ids, labels: m(input_ids=ids, labels=labels).loss


def _trainer(model, loss_of, compiled: bool):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_fn(x, y):  # the loss inside the compiled function
        return loss_of(model, x, y)

    loss_fn = kiln.compile(loss_fn) if compiled else loss_fn
    opt_step = kiln.compile(opt.step) if compiled else opt.step

    def step(x, y):
        loss = loss_fn(x, y)
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


@pytest.mark.parametrize("name", ["mlp", "hf_gpt2"])
def test_a_compiled_training_step_peaks_no_higher_than_eager_from_its_first_step(name):
    # the first step is the trace (the user's code run for real): its intermediates used to
    # stay alive in the trace's reference cycles through the backward and the optimizer step,
    # and the traced optimizer step's gradients past zero_grad. Measured in a fresh process, as
    # a training program runs: in the whole suite's process the first HF step still measured
    # one logits-sized tensor above eager's, from state earlier tests leave (not yet found).
    if name == "hf_gpt2":
        pytest.importorskip("transformers")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, __file__, name], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "checked 4 steps" in proc.stdout


def _check(make) -> None:
    gc.enable()
    torch.manual_seed(0)
    tokens, vocab = 128, 8192
    model, batch, loss_of = make(vocab)
    twin = copy.deepcopy(model)
    eager, compiled = _trainer(model, loss_of, False), _trainer(twin, loss_of, True)
    logits_bytes = tokens * vocab * 4
    for i in range(4):
        x, y = batch(tokens)
        with LiveBytes(_real) as want_peak:
            want = eager(x, y)
        arena_before = held_bytes()
        with LiveBytes(_real) as got_peak:
            got = compiled(x, y)
        # arena blocks (CPU) made before this step are memory it uses that the mode cannot see
        got_bytes = got_peak.peak + arena_before
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for p, q in zip(twin.parameters(), model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
        assert want_peak.peak > 2 * logits_bytes  # the measure sees the step's tensors
        # compiled steps: a training forward's or backward's arena kept between calls sat
        # under the other's peak (the backward's under the next forward's: 5 MiB above eager's
        # steady peak here, when kiln's graphs alone peak 4 MiB below it)
        margin = FIRST_MARGIN if i == 0 else 0.0
        assert got_bytes <= (1 + margin) * want_peak.peak, (i, got_bytes, want_peak.peak)
        # after zero_grad: the optimizer's state, as eager's, and every arena block kept
        kept = got_peak.now + arena_before
        assert kept <= want_peak.now + SCALARS, (i, kept, want_peak.now, held_bytes())
    print(f"checked {i + 1} steps")


if __name__ == "__main__":
    _check({"mlp": _mlp, "hf_gpt2": _hf_gpt2}[sys.argv[1]])
