"""The native bound launch (native_launch.cpp `bind_launch`), on the CPU machine: which calls it
takes itself and which it hands to its fallback, the Python launch, with the same arguments.

A taken call reads every address, asks for the stream and launches; these tests bind an empty
grid, so a taken call stops before the CUDA driver (and runs the same on a GPU machine): it is
seen by its call to `stream_of`, a handed-on one by the fallback's record. The GPU tests in
test_triton_launch.py launch real kernels through it."""

import types

import pytest
import torch
from int_values import INT_VALUES

from kiln import native


@pytest.fixture(scope="module")
def bind():
    if not native.wait(timeout=600):
        pytest.skip(f"kiln's native module is not available here: {native.status()}")
    return native.start().bind_launch


class _Hooks:
    def __init__(self):
        self.launch_enter_hook = types.SimpleNamespace(calls=[])
        self.launch_exit_hook = types.SimpleNamespace(calls=[])


def _bound(bind, knobs=None, codes=b"pp", classes=None):
    fell, streams = [], []

    def fallback(*args, **kwargs):
        fell.append((args, kwargs))

    def stream_of(device):
        streams.append(device)
        return 0

    classes = bytes(len(codes)) if classes is None else classes
    b = bind(fallback, 0, 0, 1, 1, 4, 0, codes, classes, 3, torch.Tensor.data_ptr, stream_of,
             knobs or _Hooks())  # fmt: skip
    return b, fell, streams


def _site(b, *args):  # one call site: the same keyword names and values every call
    return b(*args, XBLOCK=1024, num_warps=4)


def test_first_call_is_handed_on_later_ones_are_taken(bind):
    b, fell, streams = _bound(bind)
    x, y = torch.randn(64), torch.randn(64)
    assert _site(b, x, y) is None
    assert len(fell) == 1 and fell[0][0][0] is x and fell[0][0][1] is y
    assert fell[0][1] == {"XBLOCK": 1024, "num_warps": 4}
    assert streams == []
    for _ in range(3):
        assert _site(b, x, y) is None
    assert len(fell) == 1 and streams == [3, 3, 3]  # the device index given to bind_launch


def test_other_keywords_or_counts_are_handed_on(bind):
    b, fell, streams = _bound(bind)
    x, y = torch.randn(64), torch.randn(64)
    _site(b, x, y)
    _site(b, x, y)
    b(x, y, XBLOCK=1024, num_warps=8)  # another call site, other values
    b(x, y)
    b(x, y, x, XBLOCK=1024, num_warps=4)
    assert len(fell) == 4 and len(streams) == 1
    assert fell[1][1] == {"XBLOCK": 1024, "num_warps": 8} and fell[2][1] == {}
    assert len(fell[3][0]) == 3


def test_misaligned_and_non_tensor_arguments_are_handed_on(bind):
    b, fell, streams = _bound(bind)
    base = torch.randn(65)
    _site(b, base[:64], base[:64])
    _site(b, base[1:], base[:64])  # 4 bytes past an aligned address
    _site(b, base[:64], 7)
    assert len(fell) == 3 and streams == []
    assert fell[1][0][0].data_ptr() % 16 == 4 and fell[2][0][1] == 7
    _site(b, base[:64], base[:64])
    assert len(fell) == 3 and streams == [3]


def test_a_launch_hook_sends_every_call_to_the_fallback(bind):
    knobs = _Hooks()
    b, fell, streams = _bound(bind, knobs)
    x = torch.randn(64)
    _site(b, x, x)
    knobs.launch_enter_hook.calls.append(print)
    _site(b, x, x)
    knobs.launch_enter_hook.calls.clear()
    knobs.launch_exit_hook = print  # a plain function set as the hook is a hook too
    _site(b, x, x)
    knobs.launch_exit_hook = None  # and None is none
    _site(b, x, x)
    assert len(fell) == 3 and streams == [3]


def test_bind_refuses_too_many_parameters(bind):
    many = b"p" * 10_000
    with pytest.raises(ValueError, match="parameters"):
        bind(print, 0, 1, 1, 1, 4, 0, many, bytes(10_000), 0, torch.Tensor.data_ptr, print,
             _Hooks())  # fmt: skip


# -- integer (size) arguments: packed by code, taken only in the class they were compiled for --


def _class(v: int) -> int:
    from kiln.runtime.triton_launch import int_class

    return int_class(v)


def test_a_size_argument_is_taken_only_in_its_compiled_class(bind):
    x = torch.randn(64)
    b, fell, streams = _bound(bind, codes=b"pi", classes=bytes([0, _class(16)]))
    _site(b, x, 16)  # the first call records the keywords and is handed on
    for n in (16, 32, -16, 1024, 2**31 - 16):  # divisible by 16, 32 bits: taken
        _site(b, x, n)
    assert len(fell) == 1 and len(streams) == 5
    others = (17, 1, 2, 2**31, 2**31 + 16, True, 16.0, x, None)
    for n in others:
        _site(b, x, n)  # another class, type or kind: handed on, the argument as given
    assert len(streams) == 5
    assert len(fell) == 1 + len(others) and all(f[0][1] is n for f, n in zip(fell[1:], others))


def test_the_native_class_of_every_value_is_the_python_one(bind):
    """For each value a launch was compiled with, exactly the values of the same `int_class`
    are taken (the C check and the Python one agree, past 32 and 63 bits included)."""
    x = torch.randn(64)
    for v in INT_VALUES:
        code = b"c" if v == 1 else b"l"
        b, fell, streams = _bound(bind, codes=b"p" + code, classes=bytes([0, _class(v)]))
        _site(b, x, v)
        for w in INT_VALUES:
            before = len(streams)
            _site(b, x, w)
            assert (len(streams) > before) == (_class(w) == _class(v)), (v, w)


def test_a_size_compiled_as_the_constant_one_takes_only_one(bind):
    x = torch.randn(64)
    b, fell, streams = _bound(bind, codes=b"pcp", classes=bytes([0, _class(1), 0]))
    _site(b, x, 1, x)
    _site(b, x, 1, x)
    _site(b, x, 2, x)
    _site(b, x, 17, x)
    assert len(streams) == 1 and [f[0][1] for f in fell] == [1, 2, 17]


def test_tensors_and_sizes_in_any_order_keep_the_alignment_check(bind):
    base = torch.randn(65)
    b, fell, streams = _bound(bind, codes=b"ipi", classes=bytes([_class(5), 0, _class(32)]))
    _site(b, 5, base[:64], 32)
    _site(b, 7, base[:64], 48)
    _site(b, 7, base[1:], 48)  # misaligned
    _site(b, base[:64], 7, 48)  # tensor and size swapped
    assert len(streams) == 1 and len(fell) == 3


def test_bind_refuses_codes_it_cannot_pack(bind):
    def bound(codes, classes):
        return bind(print, 0, 0, 1, 1, 4, 0, codes, classes, 0, torch.Tensor.data_ptr, print,
                    _Hooks())  # fmt: skip

    with pytest.raises(ValueError, match="code f, not a pointer or an integer"):
        bound(b"pf", bytes(2))
    with pytest.raises(ValueError, match="2 classes for 1 codes"):
        bound(b"p", bytes(2))
    with pytest.raises(ValueError, match="constant 1"):
        bound(b"pc", bytes([0, _class(16)]))  # a constexpr size is the constant 1
    bound(b"pi", bytes([0, _class(1)]))  # an int parameter (annotated) may be 1
