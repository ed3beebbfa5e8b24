"""The C++ code generator against eager PyTorch: math, dtypes, reductions, norms, views, externs.

Each test compiles one graph (one C++ translation unit) holding many ops, then compares every
output with eager on the example inputs and on fresh random inputs (cg_helpers.check).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from cg_helpers import check, fresh_like, trace

from kiln.codegen import compile_graph_strict


def test_pointwise_math_and_broadcasting():
    def fn(x, y, z):
        a = torch.exp(x) * y + torch.sin(z) - x / (y.abs() + 1)
        b = torch.where(x > y, torch.tanh(a), torch.sigmoid(a))
        c = torch.clamp(a, -0.5, 0.75) + torch.rsqrt(y.abs() + 0.1) + torch.erf(x) ** 2
        d = torch.maximum(x, y) - torch.minimum(x, z) + torch.log1p(x.abs()) + x.pow(3)
        e = torch.remainder(x, 0.7) + torch.floor_divide(y, 0.3) + torch.atan2(x, y)
        return a, b, c, d, e, (x < 0.1) & (y > -0.2), x.round(), x.trunc(), x.sign()

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
            F.hardsigmoid(x),
            F.hardswish(x),
            F.hardtanh(x),
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
            torch.var_mean(x, 0),
            (x > 0.5).any(1),
            (x > -3).all(),
            torch.logsumexp(x, 1),
        )

    check(fn, torch.randn(5, 6, 7))


def test_softmax_and_layer_norm_values():
    def fn(x, w, b):
        return (
            torch.softmax(x, -1),
            torch.log_softmax(x, 1),
            torch.softmax(x, 0),
            F.layer_norm(x, (48,), w, b),
            F.layer_norm(x, (48,)),
        )

    check(fn, torch.randn(37, 48) * 4, torch.randn(48), torch.randn(48))


def test_views_cat_pad_and_creation():
    def fn(x, y):
        a = x.permute(2, 0, 1).reshape(6, -1) * 2
        b = x.transpose(0, 1)[1:, ::2].unsqueeze(0).expand(3, -1, -1, -1) + 1
        c = torch.cat([x.reshape(-1), y.view(-1)]) - 1
        d = F.pad(x, (1, 2, 0, 1), value=0.5)
        e = x[:, 1, :1].squeeze() + torch.arange(3) + torch.full((3,), 2.5)
        f = x.view(12, 2)[3:9]  # a view returned as is
        g = torch.cat([x, x * 2], dim=1)
        return a, b, c, d, e, f, g, x.t() if x.dim() == 2 else x.select(1, 0)

    check(fn, torch.randn(3, 4, 2), torch.randn(5, 2))


def test_half_types_store_half_compute_float():
    for dtype in (torch.bfloat16, torch.float16):

        def fn(x, y):
            return (x * y + 1).relu(), torch.softmax(x, -1), x.sum(1), (x + y).to(torch.float32)

        check(fn, torch.randn(16, 40, dtype=dtype), torch.randn(16, 40, dtype=dtype))


def test_float64():
    def fn(x):
        return torch.softmax(x, -1), x.exp().sum(0), F.layer_norm(x, (30,))

    c = check(fn, torch.randn(20, 30, dtype=torch.float64))
    assert "double" in c.cpp_source


def test_externs_and_restrided_inputs():
    def fn(x, w, k):
        h = torch.relu(x @ w)
        y = F.conv2d(h.reshape(1, 1, 8, 8), k)
        return h.sigmoid(), y * 2, torch.nn.functional.dropout(h, 0.0)

    x, w, k = torch.randn(8, 16), torch.randn(16, 8), torch.randn(2, 1, 3, 3)
    gm = trace(fn, x, w, k)
    c = compile_graph_strict(gm, (x, w, k))
    assert "aten_mm_out(" in c.wrapper_source  # into a buffer of the memory plan
    # A transposed input is copied into the compiled strides, and the results still match.
    xt = fresh_like(torch.randn(16, 8)).t()
    w2 = fresh_like(w)
    out = c(xt, w2, k)
    for got, exp in zip(out, fn(xt, w2, k)):
        torch.testing.assert_close(got, exp)


def test_noncontiguous_example_inputs_and_nan():
    def fn(x):
        return x.amax(1), x.argmax(1), torch.maximum(x, x.flip(1)), x.sum(0)

    x = torch.randn(7, 9).t()
    x[2, 3] = float("nan")
    check(fn, x, fresh=False)
    check(fn, torch.randn(9, 7)[:, ::1].t().contiguous().t())


def test_output_code_log_prints_wrapper_and_kernels():
    import logging

    import kiln

    records = []

    class H(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    h = H()
    logging.getLogger("kiln.output_code").addHandler(h)
    kiln.set_logs("output_code")
    try:
        c = check(lambda x: (x.cos() * 3).sum(1), torch.randn(6, 10))
    finally:
        kiln.set_logs()
        logging.getLogger("kiln.output_code").removeHandler(h)
    (text,) = records
    assert c.wrapper_source in text and 'extern "C" void kernel0' in text
    assert "def call(args):" in text and "kernel0(arg0.data_ptr()" in text


def test_extern_output_with_a_storage_offset_is_read_at_its_first_element():
    # `split` returns views into one buffer at storage offsets 0, 32, 64; the kernel reading
    # the middle one gets its data_ptr(), which already includes the offset (nanoGPT's qkv).
    # Traced with fake tensors, as AOT autograd does: their metadata carries the offsets.
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x, w):
        q, k, v = (x @ w).split(32, dim=-1)
        return k * 2 + 1, (v - q).relu()

    x, w = torch.randn(3, 16, 32), torch.randn(32, 96)
    gm = make_fx(fn, tracing_mode="fake")(x, w)
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "call_function"]
    offsets = [
        t.storage_offset() for v in vals for t in (v if isinstance(v, (list, tuple)) else [v])
    ]
    assert 32 in offsets and 64 in offsets  # the case this test is about
    compiled = compile_graph_strict(gm, [x, w])
    for args in ((x, w), (fresh_like(x), fresh_like(w))):
        for got, expected in zip(compiled(*args), fn(*args)):
            torch.testing.assert_close(got, expected)


def test_softmax_calls_exp_once_per_element():
    # The sum's loop keeps each exp(x - max) in the output row; the last loop only scales it.
    def fn(x):
        return torch.softmax(x, -1), torch.softmax(x * 2, -1).to(torch.bfloat16)

    c = check(fn, torch.randn(32, 300) * 4)
    kernels = c.cpp_source.split('extern "C" void kernel')[1:]
    assert len(kernels) == 1  # both softmaxes, one row loop
    # float32: once; bfloat16 output: the row is stored rounded, so exp is computed again.
    assert kernels[0].count("std::exp(") == 1 + 2


def test_alias_of_an_extern_output_whose_real_strides_differ_from_its_meta():
    # CPU flash attention lays its output out like its query. Traced, the query is a transposed
    # view ((B, L, H, E) memory); kiln computes it into a contiguous buffer, so the real output
    # is (B, H, L, E) while the meta said (B, L, H, E). An alias taken with the predicted
    # strides read the wrong elements (hf_llama); the wrapper must check them.
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x, k, v):
        q = x.transpose(1, 2) * 2  # eager keeps the transposed layout; kiln stores it contiguous
        y = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[0]
        return (y.transpose(1, 2),)

    x, k, v = torch.randn(2, 16, 4, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)
    gm = make_fx(fn, tracing_mode="fake")(x, k, v)
    compiled = compile_graph_strict(gm, [x, k, v])
    for args in ((x, k, v), tuple(fresh_like(t) for t in (x, k, v))):
        torch.testing.assert_close(compiled(*args)[0], fn(*args)[0])


def test_column_sums_are_summed_a_block_of_columns_at_a_time():
    # Bias-gradient sums reduce over rows of a row-major tensor: read row by row they stride
    # through memory. Rendered as column kernels they read it in order (96 columns: a full
    # block of 64 and a partial one).
    # (Columns of 128 rows: over much longer ones eager's own float32 rounding error alone
    # exceeds assert_close's defaults; kiln sums columns in double, eager in float.)
    def fn(g, x):
        return g.sum(0), (g * x).sum(0) * 2 + 1, g.view(4, 32, 96).sum((0, 1))

    c = check(fn, torch.randn(128, 96), torch.randn(128, 96))
    assert "xb += 64" in c.cpp_source
    assert "#pragma omp simd reduction" not in c.cpp_source.split('extern "C"', 1)[1]


def test_column_sums_add_a_few_rows_in_the_compute_type_then_into_a_double_total():
    # A partial over a chunk of rows in float, not double: adding each float into a double made
    # the vectorized row loop convert every value (a 512 x 1024 bias gradient took 1.5x as
    # long). The column's total stays in double, so a long column is still summed closer to
    # exact than eager's own float sum is.
    def fn(g):
        return (g.sum(0),)

    c = check(fn, torch.randn(512, 96))
    assert "float part_" in c.cpp_source and "double acc_" in c.cpp_source
    g = torch.randn(8192, 80) + 3
    (got,) = check(fn, g, fresh=False)(g)
    exact = g.double().sum(0)
    assert (got.double() - exact).abs().max() <= (g.sum(0).double() - exact).abs().max() + 1e-4
    d = check(fn, torch.randn(256, 96, dtype=torch.float64))
    assert "double part_" in d.cpp_source


def test_layer_norm_weight_gradient_sums_are_column_kernels_too():
    # Per-row statistics (mean, rstd: one value per reduced position) and per-column weights
    # ride along in the column layout; the sums still read the gradient in memory order.
    def fn(g, x, mean, rstd, w):
        xhat = (x - mean) * rstd
        return (g * xhat).sum(0), g.sum(0), (g * w * xhat).sum(0)

    args = (torch.randn(128, 96), torch.randn(128, 96), torch.randn(128, 1), torch.rand(128, 1))
    c = check(fn, *args, torch.randn(96))
    assert "xb += 64" in c.cpp_source
    assert "#pragma omp simd reduction" not in c.cpp_source.split('extern "C"', 1)[1]


def test_cat_along_the_row_is_one_plain_loop_per_piece():
    # Each piece of the row copies (or computes) from its own input: no select between the
    # inputs, no clamped index, loops GCC vectorizes.
    def fn(a, b, c):
        return (torch.cat([a, b.exp(), c], -1),)

    c = check(fn, torch.randn(64, 300), torch.randn(64, 200), torch.randn(64, 100))
    src = c.cpp_source.split('extern "C" void', 1)[1]
    for start, end in ((0, 300), (300, 500), (500, 600)):
        assert f"for (int64_t r = {start}; r < {end}; ++r)" in src
    assert " ? " not in src and "std::min" not in src and "std::max" not in src
