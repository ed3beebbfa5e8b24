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
    assert len(clones) == 1  # the graph input; the second conv's input is channels-last already


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
