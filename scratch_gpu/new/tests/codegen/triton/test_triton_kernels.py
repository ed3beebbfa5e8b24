"""The Triton code generator against eager PyTorch, on the CPU through Triton's interpreter.

An OpInfo-style subset: pointwise math and broadcasting, activations, integer and bool ops,
reductions (persistent and looped), softmax, layer norm, views and transposes, casts, half
types. Each test compiles one graph holding many ops, then compares every output with eager on
the example inputs and on fresh random inputs (tr_helpers.check).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tr_helpers import check, kernel_count, kernel_source, require_interpreter

pytestmark = pytest.mark.usefixtures("_interpreter")


@pytest.fixture
def _interpreter():
    require_interpreter()


def test_pointwise_math_and_broadcasting():
    def fn(x, y, z):
        a = torch.exp(x) * y + torch.sin(z) - x / (y.abs() + 1)
        b = torch.where(x > y, torch.tanh(a), torch.sigmoid(a))
        c = torch.clamp(a, -0.5, 0.75) + torch.rsqrt(y.abs() + 0.1) + torch.erf(x) ** 2
        d = torch.maximum(x, y) - torch.minimum(x, z) + torch.log1p(x.abs()) + x.pow(3)
        e = torch.remainder(x, 0.7) + torch.floor_divide(y, 0.3) + torch.atan2(x, y)
        f = torch.expm1(x) + torch.asinh(y) + torch.hypot(x, z) + torch.lgamma(x.abs() + 0.5)
        return a, b, c, d, e, f, (x < 0.1) & (y > -0.2), x.round(), x.trunc(), x.sign()

    check(fn, torch.randn(8, 33), torch.randn(33), torch.randn(8, 1))


def test_activations():
    def fn(x):
        return (
            F.gelu(x),
            F.gelu(x, approximate="tanh"),
            F.silu(x),
            F.relu(x),
            F.leaky_relu(x, 0.2),
            F.elu(x),
            F.softplus(x),
            F.hardswish(x),
            F.mish(x),
        )

    check(fn, torch.randn(4, 65) * 3)


def test_integer_and_bool_math():
    def fn(a, b, m):
        return (
            a + b * 3,
            a // torch.where(b == 0, 1, b),
            torch.remainder(a, torch.where(b == 0, 5, b)),
            a.abs() - b,
            (a > b) | m,
            a.to(torch.float32) / 3,
            torch.bitwise_xor(a, b),
            m.logical_not(),
            a.max(),
            (a * 2).sum(1),
            torch.pow(a, b.abs()),
            a << 2,
            a >> 1,
        )

    check(fn, torch.randint(-50, 50, (6, 7)), torch.randint(-5, 5, (6, 7)), torch.rand(6, 7) > 0.5)
    a, b = torch.randint(-50, 50, (3, 5)), torch.randint(-5, 5, (3, 5))
    check(fn, a.to(torch.int32), b.to(torch.int32), torch.rand(3, 5) > 0.5)


def test_reductions():
    def fn(x):
        return (
            x.sum(),
            x.sum(1),
            x.sum(0, keepdim=True),
            x.mean((0, 2)),
            x.amax(-1),
            x.amin(0),
            x.argmax(1),
            x.argmin(),
            x.max(dim=2),
            (x * 0.1 + 1).prod(2),
            x.var(1),
            x.std(2, correction=0),
            (x > 0.5).any(1),
            (x > -3).all(2),
            torch.logsumexp(x, 1),
        )

    check(fn, torch.randn(3, 37, 5))


def test_empty_reductions_and_tensors():
    def fn(x, e):
        return x.sum(1), x.amax(0), x.prod(1), e * 2

    check(fn, torch.randn(3, 0), torch.randn(0, 4))


def test_looped_reductions_long_rows():
    """Rows longer than a persistent block: each member loops over the row in chunks."""

    def fn(x, w, b):
        return (
            torch.softmax(x, -1),
            x.sum(1),
            x.argmax(1),
            x.amin(1),
            F.layer_norm(x, (x.shape[1],), w, b),
        )

    def scales(x, w, b):
        # a float32 sum of 5000 terms is known to eps * sum|x| in any order (module doc of
        # tr_helpers); eager's cascade happens to be closer on some samples
        return {1: x.abs().sum(1).max().item()}

    n = 5000
    c = check(fn, torch.randn(3, n), torch.randn(n), torch.randn(n), scales=scales)
    assert "for roffset in range(0, 5000, RBLOCK):" in c.triton_source


def test_softmax_and_layer_norm():
    def fn(x, w, b):
        return (
            torch.softmax(x, -1),
            torch.log_softmax(x, 1),
            torch.softmax(x, 0),
            F.layer_norm(x, (x.shape[-1],), w, b),
            F.layer_norm(x, (x.shape[-1],)),
        )

    check(fn, torch.randn(6, 50), torch.randn(50), torch.randn(50))


def test_views_and_transposes():
    def fn(x, y):
        return (
            x.t() + 1,
            x.permute(1, 0).contiguous() * y.t(),
            x[1:, ::2] * 2,
            x.unsqueeze(0).expand(3, -1, -1) - x,
            x.reshape(4, -1).sum(1),
            torch.cat([x, y], 0),
            x.t().reshape(-1)[:10] + 3,
            x.narrow(1, 3, 7).exp(),
        )

    check(fn, torch.randn(40, 36), torch.randn(40, 36))


def test_tiled_transpose_kernel():
    def fn(x):  # eager keeps x.t()'s layout for the pointwise result; contiguous() transposes
        return ((x.t() * 2 + 1).contiguous(),)

    c = check(fn, torch.randn(64, 96))
    assert "YBLOCK" in c.triton_source
    assert "mask" not in c.triton_source  # 96 x 64 in 32 x 32 tiles: no access overhangs
    c = check(fn, torch.randn(48, 40))
    assert "YBLOCK" in c.triton_source and "ymask & xmask" in c.triton_source


def test_non_contiguous_inputs():
    def fn(x, y):
        return x * y + 1, (x - y).sum(0)

    base = torch.randn(33, 20)
    check(fn, base.t(), torch.randn(20, 33))


def test_casts():
    def fn(x, i, m):
        return (
            x.to(torch.int32),
            x.to(torch.int64) + i,
            i.to(torch.float32) * 0.5,
            m.to(torch.float32) + x,
            x.to(torch.bool),
            x.to(torch.bfloat16),
            x.to(torch.float16),
            i.to(torch.bool),
            (x * 100).to(torch.uint8),
            x.to(torch.float64) * 2,
        )

    check(fn, torch.randn(5, 9) * 10, torch.randint(-9, 9, (5, 9)), torch.rand(5, 9) > 0.5)


@pytest.mark.parametrize("emulate", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_types(dtype, emulate):
    def fn(x, y, w):
        a = torch.sigmoid(x) * y + x
        return (
            a,
            a.sum(1),
            torch.softmax(x, -1),
            F.layer_norm(x, (x.shape[1],), w, w),
            (x * 3).to(torch.float32),
            x.amax(0),
        )

    x, y, w = torch.randn(7, 40, dtype=dtype), torch.randn(7, 40, dtype=dtype), torch.randn(40)
    c = check(fn, x, y, w.to(dtype), options={"triton.emulate_precision_casts": emulate})
    assert ".to(tl.float32)" in c.triton_source  # loaded to float32, computed there
    rounding = "_round_bf16(" if dtype == torch.bfloat16 else ".to(tl.float16).to(tl.float32)"
    lines = c.triton_source.split("def kernel0")[1].splitlines()
    between = [ln for ln in lines if rounding in ln and "tl.store" not in ln]
    # eager rounds every op's result; by default kiln keeps them in float32 (as torch.compile)
    assert bool(between) == emulate, between


def test_explicit_half_cast_inside_a_kernel_still_rounds():
    def fn(x):
        return (x.to(torch.bfloat16).to(torch.float32) * 3 + x.exp(),)

    c = check(fn, torch.randn(6, 50))  # float32 output: compared with eager at float32 tolerance
    assert kernel_count(c) == 1


def test_extern_matmul_with_epilogue():
    def fn(a, b, bias):
        return (torch.relu(a @ b + bias), torch.bmm(a.unsqueeze(0), b.unsqueeze(0)).sum(-1))

    c = check(fn, torch.randn(8, 16), torch.randn(16, 12), torch.randn(12))
    assert "aten_" in c.wrapper_source


def test_kernel_source_is_plain_triton():
    def fn(x):
        return (torch.softmax(x, -1) + 1,)

    c = check(fn, torch.randn(4, 24))
    src = kernel_source(c, "kernel0")
    assert "tl.program_id(0)" in src and "tl.store(" in src


def test_embedding_stays_an_extern_call_in_triton_graphs():
    # lower/ fuses gathers as indirect loads for the C++ renderer; Triton graphs on CPU tensors
    # (this interpreter) must keep the extern call, which the Triton printer can run.
    def fn(idx, w):
        return (F.embedding(idx, w) * 2 + 1,)

    w = torch.randn(50, 16)
    c = check(fn, torch.randint(0, 50, (4, 7)), w, fresh=False)  # fresh_like: any int, < 0 too
    idx = torch.randint(0, 50, (4, 7))
    torch.testing.assert_close(c(idx, w)[0], fn(idx, w)[0])
    assert "aten_embedding" in c.wrapper_source


def test_inputs_with_a_storage_offset_are_read_at_their_first_element():
    # a kernel gets data_ptr(), which already points at the tensor's first element: the
    # storage offset must not be added again (it read past the tensor on the GPU)
    def fn(x, y):
        return (x * 2 + y.exp(),)

    base_x, base_y = torch.randn(70), torch.randn(10, 12)
    x, y = base_x[6:], base_y[2:, 1:9]  # offsets 6 and 25
    c = check(fn, x.view(8, 8), y, fresh=False)
    assert "+ 6" not in c.triton_source and "+ 25" not in c.triton_source
    x2, y2 = torch.randn(70)[6:].view(8, 8), torch.randn(10, 12)[2:, 1:9]
    torch.testing.assert_close(c(x2, y2)[0], fn(x2, y2)[0])


def test_extern_views_with_a_storage_offset_are_read_once_offset():
    # `as_strided` stays an ATen call; its later chunks are views with a storage offset, and a
    # kernel receives their data_ptr(), which already points at the chunk: the kernel's index
    # must not add the offset again (it read the wrong chunk, or past the buffer on the GPU).
    def fn(a, b):
        m = torch.mm(a, b)
        q, k, v = (m.as_strided((5, 16), (48, 1), offset) for offset in (0, 16, 32))
        return (q * 2 + k.exp() - v, torch.cat([v, k], dim=0))

    c = check(fn, torch.randn(5, 8), torch.randn(8, 48))
    assert "aten_as_strided" in c.wrapper_source


def test_bf16_conversions_follow_where_the_kernel_runs():
    """Compiled for a GPU, float32 -> bfloat16 is the hardware's round-to-nearest-even; in the
    interpreter (NumPy truncates) integer ops that round the same way. Stores go through
    `_to_bf16` either way."""
    from kiln.codegen.triton.ops import prelude, store_cast

    compiled, interpreted = prelude(False), prelude(True)
    assert "return x.to(tl.bfloat16).to(tl.float32)" in compiled
    assert "0x7FFF" not in compiled
    assert "u = u + 0x7FFF + ((u >> 16) & 1)" in interpreted
    assert store_cast(torch.bfloat16).format("v") == "_to_bf16(v)"
    c = check(lambda x: (x * 0.3 + 1,), torch.randn(9, 33, dtype=torch.bfloat16))
    assert "0x7FFF" in c.triton_source and "_to_bf16(" in c.triton_source
