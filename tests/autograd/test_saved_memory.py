"""Memory the partition keeps from the forward to the backward: at most what eager autograd
saves, measured on the tensors themselves (`saved_tensors_hooks`), with eager's gradients."""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F
from aot_helpers import clone_inputs, compare

from kiln.autograd import aot_compile
from kiln.autograd.backend import eager_graph
from kiln.bench.live_bytes import LiveBytes

aten = torch.ops.aten


def saved_activation_bytes(fn, inputs: list) -> int:
    """Bytes of the distinct storages autograd saves while `fn(*inputs)` runs, the inputs'
    own storages left out (a parameter saved for a matmul costs nothing more)."""
    given = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in given:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())


def _compiled(fn, inputs):
    return aot_compile(
        torch.fx.symbolic_trace(fn),
        clone_inputs(inputs),
        fw_compiler=eager_graph,
        bw_compiler=eager_graph,
    )


def _lm_loss(h, w, targets):
    """A language model's head and loss: logits far larger than anything else in the step."""
    logits = h @ w
    return (F.cross_entropy(logits, targets), logits)


def _lm_inputs(tokens: int = 64, d: int = 16, vocab: int = 2000):
    return [
        torch.randn(tokens, d, requires_grad=True),
        torch.randn(d, vocab, requires_grad=True),
        torch.randint(0, vocab, (tokens,)),
    ]


def test_cross_entropy_saves_one_logits_sized_tensor_at_most():
    # Eager saves log_softmax's output (one logits-sized tensor) and builds the one-hot of the
    # targets in the backward. Saving that one-hot as well (zeros + scatter, computed in the
    # forward because it reads no tangent) doubled the bytes kept across the step.
    inputs = _lm_inputs()
    compiled = _compiled(_lm_loss, inputs)
    logits_bytes = 64 * 2000 * 4
    got = saved_activation_bytes(compiled, clone_inputs(inputs))
    eager = saved_activation_bytes(_lm_loss, clone_inputs(inputs))
    assert got <= eager, (got, eager)
    assert got < 2 * logits_bytes, got
    (part,) = compiled.partitions.values()
    assert not [n for n in part.fw.graph.nodes if "scatter" in str(n.target)]
    compare(torch.fx.symbolic_trace(_lm_loss), _lm_inputs(), compiled=compiled)


def test_nll_loss_backward_matches_aten_for_every_reduction_weight_and_ignore_index():
    # kiln's own decomposition (a comparison with an iota instead of zeros + scatter)
    from kiln.autograd.decomps import default_decompositions

    decomp = default_decompositions()[aten.nll_loss_backward.default]
    for reduction in (0, 1, 2):  # none, mean, sum
        for weight in (None, torch.rand(7)):
            for ignored in ("none", "one", "all"):  # all: a mean over a total weight of 0
                for batched in (True, False):
                    x = torch.randn(5, 7) if batched else torch.randn(7)
                    t = torch.randint(0, 7, (5,) if batched else ())
                    if ignored == "one" and batched:
                        t[1] = 2
                    elif ignored == "all":
                        t.fill_(2)
                    ignore = -100 if ignored == "none" else 2
                    out, total = aten.nll_loss_forward(x, t, weight, reduction, ignore)
                    g = torch.randn(out.shape)
                    want = aten.nll_loss_backward(g, x, t, weight, reduction, ignore, total)
                    got = decomp(g, x, t, weight, reduction, ignore, total)
                    torch.testing.assert_close(got, want)


def test_cross_entropy_trains_like_eager_through_the_code_generator():
    # the one-hot's comparison is lowered (CPU C++ kernels): loss and gradients equal eager's,
    # with ignored targets, class weights, a sum and label smoothing
    import kiln

    def f(h, w, targets, cw):
        logits = h @ w
        return F.cross_entropy(logits, targets, weight=cw, ignore_index=-100) + F.cross_entropy(
            logits, targets, reduction="sum", label_smoothing=0.1
        )

    compiled = kiln.compile(f)
    for _ in range(2):
        h, w, targets = _lm_inputs(tokens=24, d=8, vocab=300)
        targets[::5] = -100
        cw = torch.rand(300)
        ref_in = [h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()]
        got_in = [h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()]
        want = f(*ref_in, targets, cw)
        got = compiled(*got_in, targets, cw)
        want.backward()
        got.backward()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for g, r in zip(got_in, ref_in):  # sums over tokens: reassociated in the kernels
            torch.testing.assert_close(g.grad, r.grad, rtol=1e-4, atol=1e-4)


def test_an_output_without_gradient_gets_no_zeros_in_the_backward():
    # A model returning (loss, logits) and a loop backpropagating the loss alone: autograd
    # used to hand the compiled backward zeros of the logits' size for the unused output
    import kiln

    def f(h, w, targets):
        logits = h @ w
        return F.cross_entropy(logits, targets), logits

    compiled = kiln.compile(f)
    for call in range(3):  # the first call is capture's (eager's); then the compiled entry
        h, w, targets = _lm_inputs(tokens=64, d=16, vocab=4000)
        ref_in = [h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()]
        got_in = [h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()]
        want = f(*ref_in, targets)[0]
        with LiveBytes() as eager_peak:
            want.backward()
        got = compiled(*got_in, targets)[0]
        with LiveBytes() as peak:
            got.backward()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for g, r in zip(got_in, ref_in):
            torch.testing.assert_close(g.grad, r.grad, rtol=1e-4, atol=1e-5)
        if call:  # eager: the one-hot, log_softmax's gradient, the matmuls' gradients
            logits_bytes = 64 * 4000 * 4
            assert peak.peak < 2 * logits_bytes, (peak.peak, logits_bytes)
            assert peak.peak <= eager_peak.peak, (peak.peak, eager_peak.peak)
