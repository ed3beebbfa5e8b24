"""The wrapper's stride checks ignore dimensions of size 1 (codegen/wrapper.py strides_differ):
an input or extern result strided differently only there is used as it is, not copied, and
the graph still computes what eager does."""

from __future__ import annotations

import torch
from cg_helpers import trace

from kiln.codegen import compile_graph_strict


def _f(x, w):
    return (torch.relu(x @ w) * 2 + x.sum(),)


def test_size_one_dims_do_not_fail_the_stride_check():
    x, w = torch.randn(1, 16), torch.randn(16, 8)
    compiled = compile_graph_strict(trace(_f, x, w), [x, w])
    assert "arg0.stride(1)" in compiled.wrapper_source  # only the dimension that is stepped
    assert "arg0.stride() !=" not in compiled.wrapper_source
    for _ in range(3):
        odd = torch.randn(16, 1).t()  # shape (1, 16), strides (1, 1) instead of (16, 1)
        w = torch.randn(16, 8)
        assert odd.stride() != (16, 1)
        (got,) = compiled(odd, w)
        torch.testing.assert_close(got, _f(odd, w)[0])


def test_a_stepped_dimension_with_other_strides_is_still_copied_into_place():
    x, w = torch.randn(4, 16), torch.randn(16, 8)
    compiled = compile_graph_strict(trace(_f, x, w), [x, w])
    t = torch.randn(16, 4).t()  # (4, 16) transposed: the kernels' strides would be wrong
    w = torch.randn(16, 8)
    (got,) = compiled(t, w)
    torch.testing.assert_close(got, _f(t, w)[0])


def test_forward_wrapper_leaves_guarded_inputs_to_captures_guards():
    """A forward graph of captured code skips the layout checks capture's guards already make;
    an input strided differently fails the guard and compiles again, so results stay right."""
    import logging

    import kiln

    def f(x, w):
        return torch.relu(x @ w) * 2 + x.sum()

    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    keep = Keep()
    logging.getLogger("kiln").addHandler(keep)
    kiln.set_logs("output_code")
    try:
        compiled = kiln.compile(f)
        w = torch.randn(16, 8)
        for x in (torch.randn(4, 16), torch.randn(16, 4).t(), torch.randn(4, 16)):
            torch.testing.assert_close(compiled(x, w), f(x, w))
    finally:
        kiln.set_logs()
        logging.getLogger("kiln").removeHandler(keep)
    wrappers = [m for m in messages if "def call" in m]
    assert len(wrappers) == 2  # the transposed input recompiled
    assert all("2 inputs' layouts are checked by capture's guards" in m for m in wrappers)
    assert not any("arg0.stride()" in m for m in wrappers)


def test_inputs_left_on_the_host_are_not_moved_to_the_device():
    """`host` inputs (CPU tensors only extern calls read, in a GPU graph) keep their layout
    check but not the device check, and are never copied to the device."""
    from kiln.codegen.wrapper import input_checks
    from kiln.lower.ir import Input, Layout

    nodes = {
        "arg0": Input("arg0", Layout((4, 4), (4, 1), torch.float32)),
        "arg1": Input("arg1", Layout((), (), torch.int64)),
    }
    lines = input_checks(("arg0", "arg1"), nodes, device=True, host=frozenset({"arg1"}))
    assert "arg0.get_device() != _device_index" in lines[0] and ", device)" in lines[0]
    assert "get_device" not in lines[1] and ", device)" not in lines[1]
    assert "arg1.shape != ()" in lines[1]
