"""Channels-last convolutions (rewrites/conv_layout.py): a CPU graph's 2-D convolutions read
channels-last inputs, the batch norms and ReLUs between them follow, outputs keep eager's
strides, and results match eager on fresh random inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from cg_helpers import check  # noqa: E402  (tests/rewrites/conftest.py)
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.rewrites.conv_layout import channels_last_convolutions


def _block(x, w1, w2, mean, var, gamma, beta):
    def bn(t):
        return F.batch_norm(t, mean, var, gamma, beta, training=False)

    h = F.relu(bn(F.conv2d(x, w1, padding=1)))
    h = F.relu(bn(F.conv2d(h, w2, padding=1)) + x)
    return F.adaptive_avg_pool2d(h, 1).flatten(1)


def _args():
    c = 16
    return (
        torch.randn(2, c, 12, 12),
        torch.randn(c, c, 3, 3) * 0.1,
        torch.randn(c, c, 3, 3) * 0.1,
        torch.randn(c),
        torch.rand(c) + 0.5,
        torch.randn(c),
        torch.randn(c),
    )


def test_convolutions_read_channels_last_and_only_the_first_input_is_copied():
    args = _args()
    gm = make_fx(_block)(*args)
    assert channels_last_convolutions(gm, args)
    convs = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
    for conv in convs:
        assert conv.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last)
        assert conv.meta["val"].is_contiguous(memory_format=torch.channels_last)
    clones = [n for n in gm.graph.nodes if n.target is torch.ops.aten.clone.default]
    copied = [c.args[0] for c in clones]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # the graph input (the second conv's input is channels-last already) and the two weights
    assert copied == [placeholders[0], placeholders[1], placeholders[2]]
    for conv in convs:
        assert conv.args[1].meta["val"].is_contiguous(memory_format=torch.channels_last)


def test_channels_last_convolutions_copy_nothing_inside_aten():
    # Given a contiguous weight and a channels-last input, ATen copies the weight into the
    # input's layout inside every call; the weights are converted by kiln's kernels instead.
    args = _args()
    c = check(_block, *args)
    fresh = _args()  # new random values (the variance stays positive)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = c(*fresh)
    names = {e.key for e in prof.key_averages()}
    assert "aten::convolution" in names
    assert not names & {"aten::copy_", "aten::contiguous", "aten::clone"}, names
    torch.testing.assert_close(got[0], _block(*fresh))


def test_a_shared_weight_is_converted_once_and_a_channels_last_input_alone_is_enough():
    # The input arrives channels-last (no clone for it), one weight serves two convolutions.
    def fn(x, w):
        return F.conv2d(F.relu(F.conv2d(x, w, padding=1)), w, padding=1)

    args = (
        torch.randn(2, 8, 10, 10).contiguous(memory_format=torch.channels_last),
        torch.randn(8, 8, 3, 3),
    )
    gm = make_fx(fn)(*args)
    assert channels_last_convolutions(gm, args)
    clones = [n for n in gm.graph.nodes if n.target is torch.ops.aten.clone.default]
    assert [c.args[0].name for c in clones] == ["w_1"]
    c = check(fn, *args, inputs_fn=lambda: (torch.randn_like(args[0]), torch.randn_like(args[1])))
    out = c(*args)[0]
    assert out.stride() == fn(*args).stride()


def test_a_weight_stays_when_the_input_layout_is_ambiguous():
    # One input channel: the input is both contiguous and channels-last, and ATen's layout
    # then follows the weight's; converting the weight would change the output's strides.
    def fn(x, w):
        return F.conv2d(x, w, padding=1)

    args = torch.randn(2, 1, 10, 10), torch.randn(4, 1, 3, 3)
    gm = make_fx(fn)(*args)
    channels_last_convolutions(gm, args)
    assert not any(n.target is torch.ops.aten.clone.default for n in gm.graph.nodes)
    check(fn, *args)


def test_compiled_block_matches_eager_and_keeps_the_output_strides():
    args = _args()
    c = check(_block, *args)
    assert "(2304, 1, 192, 16)" in c.wrapper_source  # a channels-last [2, 16, 12, 12] buffer
    assert c(*args)[0].stride() == _block(*args).stride()


def test_a_graph_returning_a_4d_activation_is_left_alone():
    # A training forward returns its activations for the backward, traced with their strides.
    def fn(x, w):
        h = F.relu(F.conv2d(x, w, padding=1))
        return h, h.sum()

    args = torch.randn(2, 8, 10, 10), torch.randn(8, 8, 3, 3)
    gm = make_fx(fn)(*args)
    assert not channels_last_convolutions(gm, args)
    assert not any(n.target is torch.ops.aten.clone.default for n in gm.graph.nodes)
    c = check(fn, *args)
    assert c(*args)[0].is_contiguous()
