"""Memory the partition keeps from the forward to the backward: at most what eager autograd
saves, measured on the tensors themselves (`saved_tensors_hooks`), with eager's gradients."""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F
from aot_helpers import clone_inputs, compare

from kiln.autograd import aot_compile
from kiln.autograd.backend import eager_graph
from kiln.autograd.partition import value_bytes
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
    # Where eager saves the log-probabilities, a tensor written only to be kept, kiln saves
    # the logits the forward returns anyway and two floats a row (max and log-sum-exp), and its
    # forward writes no log-probabilities: the gather of the loss reads the logits.
    inputs = _lm_inputs()
    compiled = _compiled(_lm_loss, inputs)
    logits_bytes = 64 * 2000 * 4
    got = saved_activation_bytes(compiled, clone_inputs(inputs))
    eager = saved_activation_bytes(_lm_loss, clone_inputs(inputs))
    assert got <= eager + 2 * 4 * 64, (got, eager)
    assert got < 2 * logits_bytes, got
    (part,) = compiled.partitions.values()
    assert not [n for n in part.fw.graph.nodes if "scatter" in str(n.target)]
    outputs = list(next(n for n in part.fw.graph.nodes if n.op == "output").args[0])
    logits = outputs[1]
    big = [n for n in outputs[part.num_fw_outputs :] if value_bytes(n) >= logits_bytes]
    assert big == [logits], (big, logits)
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


class _LmHead(torch.nn.Module):
    """A language model's head and loss under bf16 autocast: bf16 logits, upcast to float32 for
    the cross-entropy (`upcast`: explicitly, as Hugging Face's loss does; else autocast's own
    float32 cross-entropy does it)."""

    def __init__(self, d: int, vocab: int, upcast: bool):
        super().__init__()
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.upcast = upcast

    def forward(self, h, targets):
        with torch.autocast("cpu", torch.bfloat16):
            logits = self.head(h)
            if self.upcast:
                logits = logits.float()
            return F.cross_entropy(logits, targets)


def _real(t) -> bool:
    """A tensor with memory: not a fake or meta one of the compile's tracing (first call)."""
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta"


def _saved_tensors(fn, args, exclude) -> list[torch.Tensor]:
    """(what `fn(*args)` returns, the distinct tensors autograd saves while it runs, those on
    the storages in `exclude` left out)."""
    seen: dict[int, torch.Tensor] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in exclude:
            seen.setdefault(t.untyped_storage().data_ptr(), t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, list(seen.values())


def test_bf16_cross_entropy_saves_the_bf16_logits_not_a_float32_copy():
    # GPT-2 trained under bf16 autocast: eager saves log_softmax's float32 output (twice the
    # bf16 logits' bytes; 1.65 GB at 8 x 1024 tokens); kiln saves the bf16 logits and two
    # floats a row, and recomputes the upcast and the log-softmax in the backward's one kernel.
    import kiln

    tokens, d, vocab = 256, 16, 2000
    for upcast in (True, False):
        torch.manual_seed(0)
        model = _LmHead(d, vocab, upcast)
        ref = _LmHead(d, vocab, upcast)
        ref.load_state_dict(model.state_dict())
        compiled = kiln.compile(model)
        for call in range(3):  # the first call is capture's (eager's); then the compiled entry
            h = torch.randn(tokens, d, requires_grad=True)
            targets = torch.randint(0, vocab, (tokens,))
            h_ref = h.detach().clone().requires_grad_()
            exclude = {t.untyped_storage().data_ptr() for t in (h, targets, model.head.weight)}
            with LiveBytes(_real) as peak:  # forward and backward
                loss, saved = _saved_tensors(compiled, (h, targets), exclude)
                loss.backward()
            want = ref(h_ref, targets)
            want.backward()
            torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(h.grad, h_ref.grad, rtol=1e-2, atol=1e-4)
            torch.testing.assert_close(
                model.head.weight.grad, ref.head.weight.grad, rtol=1e-2, atol=1e-4
            )
            model.zero_grad(set_to_none=True)
            ref.zero_grad(set_to_none=True)
            if not call:
                continue
            logits_bf16 = tokens * vocab * 2
            big_fp32 = [
                (tuple(t.shape), t.dtype)
                for t in saved
                if t.dtype == torch.float32 and t.numel() >= tokens * vocab
            ]
            assert not big_fp32, big_fp32
            # the bf16 logits, the head's bf16 weight and input (the matmul's backward reads
            # them, as eager's does), a few floats a row
            bound = logits_bf16 + vocab * d * 2 + tokens * d * 2 + 16 * tokens
            got = sum(t.untyped_storage().nbytes() for t in saved)
            assert got <= bound, (got, bound, [(tuple(t.shape), t.dtype) for t in saved])
            # at most the logits and their gradient (bf16: the backward's one kernel writes it
            # from the saved logits) alive at once, with the head's weight-sized tensors (its
            # bf16 copy, its gradient in bf16 and float32): no float32 tensor of the logits' size
            bound = 2 * logits_bf16 + vocab * d * 8 + 64 * tokens
            assert peak.peak <= bound, (peak.peak, bound)
