"""Programs of ordinary model code: arithmetic, torch calls, control flow, loops, containers,
comprehensions, builtins, math/operator, globals, closures and f-strings. Each is compiled
with a graph-counting backend and compared with eager over several calls."""

import math
import operator
from functools import reduce

import pytest
import torch
import torch.nn.functional as F
from harness import check, randn2

SCALE = 0.5
OFFSETS = [1.0, 2.0, 3.0]
TABLE = {"a": 1.5, "b": -2.0}


def helper_double(x):
    return x * 2


def make_adder(k):
    def add(x):
        return x + k

    return add


ADD3 = make_adder(3.0)

PROGRAMS = {
    # arithmetic on tensors and Python numbers
    "add_mul": (lambda x, y: x + y * 2, randn2(4, 5)),
    "sub_div": (lambda x, y: (x - y) / (y.abs() + 1), randn2(3, 7)),
    "pow_neg": (lambda x, y: -(x**2) + y**3, randn2(6)),
    "floordiv_mod": (lambda x, y: (x * 10) // 3 + (y * 10) % 4, randn2(5, 2)),
    "matmul_op": (lambda x, y: x @ y.t(), randn2(4, 4)),
    "reflected": (lambda x, y: 1 - x + 2 * y + 3 / (y.abs() + 1), randn2(8)),
    "python_numbers": (lambda x, y: x * (3 + 4 * 2 - 1) / 2.5, randn2(3)),
    "comparisons": (lambda x, y: ((x > y) & (x < 1)) | (y >= 0.5), randn2(9)),
    "eq_ne": (lambda x, y: (x == x) & (y != x), randn2(4)),
    "bitwise_int": (lambda x, y: ((x * 10).int() ^ 3) << 1, randn2(5)),
    "inplace_local": (lambda x, y: _inplace_local(x, y), randn2(4, 4)),
    "unary": (lambda x, y: -x + abs(y) + (+x), randn2(3, 3)),
    # torch functions, F calls and tensor methods
    "torch_funcs": (lambda x, y: torch.tanh(x) + torch.sigmoid(y) * torch.exp(-x.abs()), randn2(4)),
    "functional": (lambda x, y: F.gelu(x) + F.silu(y) + F.softmax(x, dim=-1), randn2(3, 8)),
    "methods": (
        lambda x, y: x.sin().cos().clamp(-0.5, 0.5).mean(dim=1, keepdim=True),
        randn2(4, 6),
    ),
    "views": (lambda x, y: x.view(2, -1).transpose(0, 1).reshape(-1).unsqueeze(0), randn2(4, 6)),
    "indexing": (lambda x, y: x[1:, ::2] + y[:-1, 1::2], randn2(5, 6)),
    "index_none_ellipsis": (lambda x, y: x[None, ..., 0] * y[..., 1], randn2(3, 4, 2)),
    "setitem": (lambda x, y: _setitem(x, y), randn2(4, 4)),
    "cat_stack": (
        lambda x, y: torch.cat([x, y], dim=0) + torch.stack([x, y]).sum(0).repeat(2, 1),
        randn2(2, 3),
    ),
    "split_chunk": (
        lambda x, y: sum(c.sum() for c in x.chunk(3, dim=1)) + y.split(2)[0].mean(),
        randn2(4, 6),
    ),
    "reductions": (
        lambda x, y: (x.sum(), x.max(dim=1).values, y.argmax(-1), x.std()),
        randn2(4, 5),
    ),
    "where_masked": (lambda x, y: torch.where(x > 0, x, y).masked_fill(y > 1, 0.0), randn2(6, 2)),
    "factory": (lambda x, y: x + torch.ones(3) * 2 + torch.arange(3).float(), randn2(3)),
    "like_funcs": (lambda x, y: torch.zeros_like(x) + torch.full_like(y, 2.0) + x, randn2(2, 2)),
    "dtype_cast": (lambda x, y: x.to(torch.float64) + y.double() + x.half().float(), randn2(3)),
    "einsum": (lambda x, y: torch.einsum("ij,kj->ik", x, y), randn2(3, 4)),
    "linear_fn": (lambda x, y: F.linear(x, y, None), randn2(4, 4)),
    "softmax_chain": (lambda x, y: F.log_softmax(x @ y, dim=-1).exp(), randn2(5, 5)),
    "tensor_iter": (lambda x, y: [r * 2 for r in x], randn2(3, 4)),
    "metadata": (
        lambda x, y: x.reshape(x.shape[0] * x.shape[1]) * x.dim() + x.numel(),
        randn2(2, 3),
    ),
    "size_method": (lambda x, y: x.new_zeros(x.size(0), 2) + y.size(-1), randn2(3, 2)),
    # control flow on constants, arguments, shapes, dtypes and devices
    "if_shape": (lambda x, y: x * 2 if x.shape[0] > 2 else x - 1, randn2(4, 2)),
    "if_dtype": (lambda x, y: x.float() if x.dtype == torch.float64 else x + y, randn2(3)),
    "if_device": (lambda x, y: x + 1 if x.device.type == "cpu" else x - 1, randn2(3)),
    "if_ndim": (lambda x, y: x.sum(-1) if x.ndim == 2 else x, randn2(3, 3)),
    "if_none": (lambda x, y: _maybe(x, None) + _maybe(y, 2.0), randn2(3)),
    "if_isinstance": (lambda x, y: _isinst(x, 3) + _isinst(y, 2.5), randn2(4)),
    "ternary_chain": (
        lambda x, y: (x if SCALE > 1 else y) * (2 if len(OFFSETS) == 3 else 3),
        randn2(3),
    ),
    "while_loop": (lambda x, y: _while(x), randn2(3)),
    "early_return": (lambda x, y: _early(x, y), randn2(3)),
    "assert_shape": (lambda x, y: _asserts(x, y), randn2(4, 4)),
    # loops
    "for_range": (lambda x, y: _for_range(x, 4), randn2(3)),
    "enumerate_zip": (lambda x, y: _enum_zip([x, y], [1.0, 2.0]), randn2(3)),
    "reversed_list": (lambda x, y: _reversed([x, y, x + y]), randn2(2)),
    "dict_iter": (lambda x, y: _dict_iter({"a": x, "b": y}), randn2(3)),
    "tuple_iter": (lambda x, y: _tuple_iter((x, y, 2.0)), randn2(3)),
    "nested_loops": (lambda x, y: _nested(x), randn2(2, 2)),
    "break_continue": (lambda x, y: _break_continue(x), randn2(3)),
    "for_else": (lambda x, y: _for_else(x), randn2(3)),
    # containers
    "list_build_index": (lambda x, y: _list_ops(x, y), randn2(3)),
    "tuple_unpack": (lambda x, y: _unpack((x, y, 1)), randn2(2)),
    "star_unpack": (lambda x, y: _star_unpack([x, y, x, y]), randn2(2)),
    "dict_ops": (lambda x, y: _dict_ops(x, y), randn2(3)),
    "set_ops": (lambda x, y: x * len({1, 2, 3} | {4}) + y * (2 in {1, 2}), randn2(3)),
    "slice_list": (lambda x, y: sum([x, y, x, y][1:3]), randn2(3)),
    "nested_struct_out": (lambda x, y: {"a": [x, (y, 1)], "b": {"c": x + y}}, randn2(2)),
    "list_arg": (lambda xs, k: xs[0] * k + xs[-1], lambda: ([torch.randn(3), torch.randn(3)], 2)),
    "dict_arg": (
        lambda d, y: d["w"] @ y + d["b"],
        lambda: ({"w": torch.randn(3, 3), "b": torch.randn(3)}, torch.randn(3)),
    ),
    "tuple_return_mixed": (lambda x, y: (x.sum(), "tag", None, 2.5, torch.float32), randn2(3)),
    # comprehensions and generator expressions
    "listcomp": (lambda x, y: torch.stack([x * i for i in range(3)]), randn2(2)),
    "dictcomp": (lambda x, y: {f"k{i}": x + i for i in range(2)}, randn2(2)),
    "setcomp_len": (lambda x, y: x * len({i % 2 for i in range(5)}), randn2(2)),
    "genexp_sum": (lambda x, y: sum(x * i for i in range(4)), randn2(3)),
    "genexp_any_all": (
        lambda x, y: x * any(i > 2 for i in range(4)) + y * all(i < 9 for i in range(4)),
        randn2(3),
    ),
    "genexp_tuple_list": (
        lambda x, y: tuple(t + 1 for t in (x, y)) + tuple(list(t * 2 for t in [x])),
        randn2(2),
    ),
    "nested_comp": (lambda x, y: [[x * i + j for j in range(2)] for i in range(2)], randn2(2)),
    "comp_filter": (lambda x, y: [x * i for i in range(6) if i % 2 == 0], randn2(2)),
    # builtins
    "len_isinstance": (
        lambda x, y: x * len([1, 2, 3]) if isinstance(y, torch.Tensor) else x,
        randn2(3),
    ),
    "getattr_hasattr": (lambda x, y: x.sin() + (1 if hasattr(y, "shape") else 0), randn2(3)),
    "min_max_abs": (lambda x, y: x * min(3, 4, 1) + y * max([2, 5]) + abs(-2), randn2(3)),
    "round_sorted": (lambda x, y: x * round(2.567, 1) + sum(sorted([3, 1, 2])[:2]), randn2(3)),
    "map_filter": (
        lambda x, y: sum(map(lambda t: t * 2, filter(lambda t: t is not None, [x, None, y]))),
        randn2(3),
    ),
    "sorted_key": (
        lambda x, y: sorted([x, y], key=lambda t: t.shape[0])[0] * 2,
        lambda: (torch.randn(3), torch.randn(2)),
    ),
    "zip_strict_like": (lambda x, y: [a + b for a, b in zip([x, y], [y, x])], randn2(2)),
    "int_float_bool": (lambda x, y: x * int(2.7) + y * float("1.5") * bool(1), randn2(2)),
    "divmod_pow": (lambda x, y: x * divmod(7, 3)[1] + pow(2, 3), randn2(2)),
    "reduce_fn": (lambda x, y: reduce(operator.add, [x, y, x]), randn2(3)),
    # math and operator
    "math_funcs": (lambda x, y: x * math.sqrt(16) + y * math.cos(0) + math.pi, randn2(3)),
    "math_scale": (lambda x, y: x / math.sqrt(x.shape[-1]) + math.log(2), randn2(3, 4)),
    "operator_funcs": (lambda x, y: operator.mul(operator.add(x, y), 2), randn2(3)),
    "operator_getitem": (
        lambda x, y: operator.getitem([x, y], 1) + operator.itemgetter(0)([x]),
        randn2(3),
    ),
    # globals and closures
    "global_const": (lambda x, y: x * SCALE + OFFSETS[1] + TABLE["b"], randn2(3)),
    "global_function": (lambda x, y: helper_double(x) + ADD3(y), randn2(3)),
    "closure_var": (
        _closure_prog := (lambda: (lambda k: lambda x, y: x * k + y)(3.0))(),
        randn2(3),
    ),
    "closure_tensor": (None, randn2(3)),
    "nested_function": (lambda x, y: _nested_fn(x, y), randn2(3)),
    "closure_nonlocal": (lambda x, y: _nonlocal(x), randn2(3)),
    # f-strings of non-tensor values
    "fstring_keys": (lambda x, y: {f"layer_{i}.{'w'}": x * i for i in range(2)}, randn2(2)),
    "fstring_format": (lambda x, y: (x * 2, f"{x.shape[0]:03d}-{SCALE:.2f}-{'a'!r}"), randn2(3)),
}

_TENSOR_CONST = torch.randn(3)
PROGRAMS["closure_tensor"] = ((lambda c: lambda x, y: x + c * y)(_TENSOR_CONST), randn2(3))


def _inplace_local(x, y):
    z = x.clone()
    z += y
    z.mul_(2)
    return z


def _setitem(x, y):
    z = x.clone()
    z[0] = y[1]
    z[:, 1] = 0.5
    return z


def _maybe(x, s):
    if s is None:
        return x
    return x * s


def _isinst(x, k):
    if isinstance(k, int):
        return x + k
    elif isinstance(k, float):
        return x * k
    return x


def _while(x):
    i = 0
    while i < 3:
        x = x * 1.5
        i += 1
    return x


def _early(x, y):
    if x.shape[0] == 3:
        return x + y
    return x - y


def _asserts(x, y):
    assert x.shape == y.shape, "shapes must match"
    assert x.dim() == 2
    return x + y


def _for_range(x, n):
    for i in range(1, n, 2):
        x = x + i
    return x


def _enum_zip(ts, ws):
    out = 0
    for i, (t, w) in enumerate(zip(ts, ws)):
        out = out + t * w + i
    return out


def _reversed(ts):
    acc = []
    for t in reversed(ts):
        acc.append(t.sum())
    return acc


def _dict_iter(d):
    total = 0
    for k, v in d.items():
        total = total + v * (1 if k == "a" else 2)
    for k in d:
        total = total + d[k]
    return total, list(d.keys())


def _tuple_iter(t):
    out = []
    for v in t:
        out.append(v * 2)
    return out


def _nested(x):
    for i in range(2):
        for j in range(2):
            x = x + i * j
    return x


def _break_continue(x):
    for i in range(10):
        if i == 1:
            continue
        if i > 3:
            break
        x = x * (i + 1)
    return x


def _for_else(x):
    for i in range(3):
        if i == 5:
            break
    else:
        x = x + 100
    return x


def _list_ops(x, y):
    items = [x, y]
    items.append(x + y)
    items.insert(0, y * 2)
    items.extend([x])
    last = items.pop()
    return items[1] + items[-1] + last + len(items)


def _unpack(t):
    a, b, c = t
    return a * c + b


def _star_unpack(ts):
    first, *middle, last = ts
    return first + last + sum(middle)


def _dict_ops(x, y):
    d = {"x": x}
    d["y"] = y
    d.update(z=x + y)
    d.setdefault("w", 2.0)
    return {k: v for k, v in d.items() if k != "x"}, d.get("missing", 7), "y" in d


def _nested_fn(x, y):
    def inner(a, b=2.0):
        return a * b

    return inner(x) + inner(y, b=3.0)


def _nonlocal(x):
    count = 0

    def bump(t):
        nonlocal count
        count += 1
        return t + count

    x = bump(x)
    x = bump(x)
    return x, count


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program(name):
    fn, make_args = PROGRAMS[name]
    graphs = 1
    if name in ("nested_struct_out",):
        graphs = 1
    check(fn, make_args, graphs=graphs)


def test_no_tensor_work_makes_no_graph():
    check(lambda x, y: (x, y, 3), randn2(3), graphs=0)


def _short_lived(x, y):
    acc = x
    for i in range(40):
        t = acc * 1.01 + y  # dies on the next iteration: its id is soon another tensor's
        acc = t.tanh() + i
    return acc


def test_intermediates_die_during_the_trace_and_ids_are_reused_safely():
    """The trace does not keep intermediates alive (memory as eager's); a dead tensor's id,
    reused by a new tensor, must not name the dead one's graph value."""
    import weakref

    import kiln
    from kiln.capture.tracer import Tracer

    made, dead_while_tracing = [], [0]
    bind = Tracer._bind_outputs

    def spy(self, out, node):
        bind(self, out, node)
        if isinstance(out, torch.Tensor):
            made.append(weakref.ref(out))
            dead_while_tracing[0] = sum(r() is None for r in made)

    Tracer._bind_outputs = spy
    try:
        x, y = torch.randn(4, 4), torch.randn(4, 4)
        torch.testing.assert_close(kiln.compile(_short_lived)(x, y), _short_lived(x, y))
    finally:
        Tracer._bind_outputs = bind
    assert dead_while_tracing[0] >= 100, "the trace kept its intermediates alive"
    check(_short_lived, randn2(4, 4))
