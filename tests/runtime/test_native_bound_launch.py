"""The native bound launch (native_launch.cpp `bind_launch`), on the CPU machine: which calls it
takes itself and which it hands to its fallback, the Python launch, with the same arguments.

A taken call reads every address, asks for the stream and launches; these tests bind an empty
grid, so a taken call stops before the CUDA driver (and runs the same on a GPU machine): it is
seen by its call to `stream_of`, a handed-on one by the fallback's record. The GPU tests in
test_triton_launch.py launch real kernels through it."""

import types

import pytest
import torch

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


def _bound(bind, knobs=None, nparams=2):
    fell, streams = [], []

    def fallback(*args, **kwargs):
        fell.append((args, kwargs))

    def stream_of(device):
        streams.append(device)
        return 0

    b = bind(fallback, 0, 0, 1, 1, 4, 0, nparams, 3, torch.Tensor.data_ptr, stream_of,
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
    with pytest.raises(ValueError, match="parameters"):
        bind(print, 0, 1, 1, 1, 4, 0, 10_000, 0, torch.Tensor.data_ptr, print, _Hooks())
