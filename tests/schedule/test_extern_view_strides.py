"""An extern call reads a view of a padded buffer as eager hands it over: a strided alias, not a
contiguous copy, with symbolic sizes too.

Why it matters: ATen kernels may require the strides eager gives them. CUDA's memory-efficient
attention takes its bias only with rows 16-byte aligned, and `scaled_dot_product_attention`
makes them so by padding the bias and slicing it back (`constant_pad_nd` -> `slice` ->
`expand` in the traced graph). A dynamic entry used to copy that view contiguous (the padded
row length `s - Mod(s + 1, 8) + 9` was not a stride the view test accepted), so fp32 Llama
decoding on the GPU died with "attn_bias is not correctly aligned (strideH)". A custom op
stands in for the attention kernel here and records the strides it was given.
"""

import torch
import torch.nn.functional as F

import kiln

_seen: list[tuple[int, ...]] = []


@torch.library.custom_op("kilntest::strided_bias_sum", mutates_args=())
def strided_bias_sum(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    _seen.append(tuple(bias.stride()))
    return x + bias.sum(-1, keepdim=True)


@strided_bias_sum.register_fake
def _(x, bias):
    return torch.empty_like(x)


def _prog(x, keep):
    n = keep.size(-1)
    bias = torch.where(keep, 0.0, -1e4)
    bias = F.pad(bias, (0, 8 - n % 8))[..., :n]  # rows padded to a multiple of 8, as sdpa does
    return strided_bias_sum(x, bias.expand(x.size(0), 4, x.size(2), n))


def _inputs(q: int, n: int):
    x = torch.randn(2, 4, q, 1)
    keep = torch.rand(1, 1, q, n) > 0.3
    return x, keep


def test_extern_reads_padded_view_with_eager_strides_at_every_size():
    compiled = kiln.compile(_prog, dynamic=True)
    for q, n in ((1, 67), (3, 70), (5, 75), (1, 81)):
        x, keep = _inputs(q, n)
        _seen.clear()
        expected = _prog(x, keep)
        eager_strides = _seen[-1]
        _seen.clear()
        torch.testing.assert_close(compiled(x, keep), expected)
        got = _seen[-1]
        # every dimension of extent > 1 strided as eager's (size-1 dimensions' strides are free)
        shape = (2, 4, q, n)
        assert [s for s, d in zip(got, shape) if d > 1] == [
            s for s, d in zip(eager_strides, shape) if d > 1
        ], (got, eager_strides, shape)
        assert got[-2] % 8 == 0 or q == 1  # the padded row length reached the kernel
