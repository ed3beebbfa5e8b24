"""Which Triton launches runtime/triton_launch.py binds natively, with which argument codes and
size classes, on the CPU machine: `int_class` is Triton 3.6's own specialization of an integer
argument, `bound_codes` takes tensors and sizes and refuses what a bound launch cannot pack, and
a `_Launch` given a compiled kernel (a stand-in with an empty grid, so nothing reaches CUDA)
puts a `BoundLaunch` in its owner's place, also when the native module loads only after the
kernel's first launch. The GPU tests in test_triton_launch.py launch real kernels this way."""

import contextlib
import types
import weakref

import pytest
import torch
from int_values import INT_VALUES

from kiln import native
from kiln.runtime import triton_launch as tl_
from kiln.runtime import triton_native_launcher as tnl


def test_int_class_is_tritons_own_specialization():
    """Triton's `specialize_impl` (what its launch path keys compiled variants on) gives
    ("constexpr", 1) for 1, else the type ("i32", "i64", "u64") and "D" for divisible by 16."""
    pytest.importorskip("triton")
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    widths = {"i32": 0, "i64": 1, "u64": 2}
    for v in INT_VALUES:
        ty, key = native_specialize_impl(BaseBackend, v, False, True, True)
        want = (ty == "constexpr") | (key == "D") << 1 | widths.get(ty, 0) << 2
        assert tl_.int_class(v) == want, (v, ty, key)


def test_bound_codes_take_tensors_and_sizes_in_order():
    x = torch.randn(8)
    codes, classes = tl_.bound_codes(b"ppic", (x, x, 17))
    assert codes == b"ppi" and list(classes) == [0, 0, tl_.int_class(17)]
    codes, classes = tl_.bound_codes(b"pcl" + b"c" * 3, (x, 1, 2**40))
    assert codes == b"pcl" and list(classes) == [0, tl_.int_class(1), tl_.int_class(2**40)]
    assert tl_.bound_codes(b"pp", (x, x)) == (b"pp", bytes(2))


@pytest.mark.parametrize(
    "codes, args, why",
    [
        (None, (0,), "no codes (a launch the bound one cannot make)"),
        (b"pf", ("t", 1.5), "a float argument"),
        (b"pp", ("t", None), "None (a constexpr of Triton's)"),
        (b"pi", ("t", True), "a bool (Triton's u1)"),
        (b"ip", ("t", 16), "a tensor where the kernel has an integer"),
        (b"pc", ("t", 16), "a positional constexpr that is not the size 1"),
        (b"pii", ("t", 16), "a parameter after them that is not a constexpr"),
        (b"p", ("t", 16), "more arguments than parameters"),
    ],
)
def test_bound_codes_refuse_what_a_bound_launch_cannot_pack(codes, args, why):
    x = torch.randn(8)
    args = tuple(x if a == "t" else a for a in args)
    assert tl_.bound_codes(codes, args) is None, why


def test_signature_codes_of_a_kernel_with_tritons_launcher():
    """A kernel first launched before the native module loaded has Triton's own launcher: its
    codes come from its signature when its launch is a plain one."""
    meta = types.SimpleNamespace(num_ctas=1, launch_cooperative_grid=False, launch_pdl=False,
                                 global_scratch_size=0, profile_scratch_size=0,
                                 tensordesc_meta=None)  # fmt: skip
    src = types.SimpleNamespace(signature={"x": "*fp32", "n": "i32", "X": "constexpr"})
    kernel = types.SimpleNamespace(src=src, metadata=meta)
    want = b"pic" if tnl.triton_version_known() else None
    assert tl_._signature_codes(kernel, object()) == want
    meta.global_scratch_size = 64
    assert tl_._signature_codes(kernel, object()) is None
    launcher = tnl.NativeLauncher(print, b"ppl")
    assert tl_._signature_codes(kernel, launcher) == b"ppl"


# -- a _Launch binding itself ----------------------------------------------------------------


@pytest.fixture
def fake_cuda(monkeypatch):
    """The stream and device reads a launch makes, on a machine without CUDA: recorded."""
    if not native.wait(timeout=600):
        pytest.skip(f"kiln's native module is not available here: {native.status()}")
    pytest.importorskip("triton")
    streams: list = []
    monkeypatch.setattr(tl_, "_stream_of", lambda device: streams.append(device) or 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return streams


def _kernel(codes: bytes, launched: list):
    """A compiled kernel as `_keep` reads it, with kiln's native launcher over `launched`."""
    launcher = tnl.NativeLauncher(lambda *a: launched.append(a[13:]), codes)
    return types.SimpleNamespace(run=launcher, function=0, packed_metadata=(4, 1, 0))


class _Triton:
    """Triton's own launch path, as `_Launch` calls it (`jit[grid](*args, **kwargs)`): records
    the call and gives the variant for its arguments, whose integer codes are 'i', or 'c' for
    a size of 1 (what Triton 3.6 compiles)."""

    def __init__(self, launched: list) -> None:
        self.calls: list = []
        self.launched = launched

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append(args)
            codes = b"".join(b"p" if isinstance(a, torch.Tensor) else b"c" if a == 1 else b"i"
                             for a in args)  # fmt: skip
            return _kernel(codes + b"c", self.launched)

        return launch


def _first_launch(args, monkeypatch):
    """A FastKernel whose empty grid (nothing reaches CUDA) had its first launch."""
    launched: list = []
    triton = _Triton(launched)
    monkeypatch.setattr(tl_, "native_launchers", contextlib.nullcontext)
    owner = tl_.FastKernel(triton)
    launch = owner[(0,)]
    launch(*args, XBLOCK=256, num_warps=4)
    return owner, launch, triton, launched


def _site(owner, *args):
    owner[(0,)](*args, XBLOCK=256, num_warps=4)


def test_a_kernel_with_size_arguments_is_bound_and_checks_their_class(fake_cuda, monkeypatch):
    x, out = torch.randn(64), torch.empty(64)
    owner, launch, triton, launched = _first_launch((x, out, 33), monkeypatch)
    assert type(owner[(0,)]).__name__ == "BoundLaunch" and launch.compiled is not None
    assert len(triton.calls) == 1 and launched == []
    _site(owner, x, out, 33)  # records the call site; the Python raw path
    assert launched == [(x.data_ptr(), out.data_ptr(), 33, 256)] and fake_cuda == [0]
    for n in (33, 35, 1001):  # the class of 33: taken natively (a stream read, no Python)
        _site(owner, x, out, n)
    assert len(launched) == 1 and len(fake_cuda) == 4 and len(triton.calls) == 1
    for n in (48, 1, 2**31 + 1):  # divisible by 16, the constant 1, 64 bits: other variants
        _site(owner, x, out, n)
    assert [a[2] for a in triton.calls[1:]] == [48, 1, 2**31 + 1] and len(fake_cuda) == 4


def test_each_class_of_a_grid_gets_its_own_bound_variant(fake_cuda, monkeypatch):
    """A grid whose size changes class: Triton's path compiles each class's variant once, and
    each is bound in front of the ones before (up to `_VARIANTS`); later launches of any of
    them are taken natively."""
    x = torch.randn(64)
    owner, launch, triton, launched = _first_launch((x, 17), monkeypatch)
    sizes = (17, 48, 1, 2**31 + 1, 19, 64, 1, 2**33 + 5, 2**31 + 16)
    for n in sizes:
        _site(owner, x, n)
    # the first class's second launch records the call site (Python raw path); each new class
    # goes to Triton once and its next launch records its call site in the same way
    assert [a[1] for a in triton.calls] == [17, 48, 1, 2**31 + 1, 2**31 + 16]
    assert len(launch.bound) == tl_._VARIANTS == 4
    before, calls = len(fake_cuda), len(triton.calls)
    for n in (19, 32, 1, 2**31 + 3, 35, 2**40 + 7):
        _site(owner, x, n)
    assert len(fake_cuda) == before + 6 and len(triton.calls) == calls
    _site(owner, x, 2**31 + 32)  # a fifth class: past the variants bound, Triton's path
    assert len(triton.calls) == calls + 1 and len(launch.bound) == 4


def test_a_tensor_only_kernel_is_still_bound(fake_cuda, monkeypatch):
    x = torch.randn(64)
    owner, *_ = _first_launch((x, x), monkeypatch)
    assert type(owner[(0,)]).__name__ == "BoundLaunch"


def test_a_kernel_launched_before_the_native_module_loaded_is_bound_later(fake_cuda, monkeypatch):
    x = torch.randn(64)
    module = native.start()
    monkeypatch.setattr(native, "start", lambda *a, **k: None)
    monkeypatch.setitem(native._state, "status", "building")
    owner, launch, _, launched = _first_launch((x, 17), monkeypatch)
    assert owner[(0,)] is launch and launch.pending is not None
    launch(x, 17, XBLOCK=256, num_warps=4)  # still building: the Python raw path
    assert owner[(0,)] is launch and len(launched) == 1
    monkeypatch.setattr(native, "start", lambda *a, **k: module)
    monkeypatch.setitem(native._state, "status", "ready")
    launch(x, 17, XBLOCK=256, num_warps=4)  # loaded now: bound from this launch on
    assert type(owner[(0,)]).__name__ == "BoundLaunch" and launch.pending is None
    assert len(launched) == 2


def test_a_native_module_that_will_not_load_stops_the_waiting(fake_cuda, monkeypatch):
    x = torch.randn(64)
    monkeypatch.setattr(native, "start", lambda *a, **k: None)
    monkeypatch.setitem(native._state, "status", "failed")
    owner, launch, _, _ = _first_launch((x, 17), monkeypatch)
    assert owner[(0,)] is launch and launch.pending is None


def test_bound_launches_leave_no_cycle(fake_cuda, monkeypatch):
    """The bound launches are not seen by the garbage collector: the `_Launch` behind them
    holds its FastKernel weakly, so dropping the FastKernel frees all of them."""
    import gc

    x = torch.randn(64)
    owner, launch, *_ = _first_launch((x, 17), monkeypatch)
    for n in (17, 48, 1):
        _site(owner, x, n)
    assert len(launch.bound) == 3
    gone = weakref.ref(owner)
    del owner, launch
    gc.collect()
    assert gone() is None
    assert not [o for o in gc.get_objects() if type(o) is tl_._Launch]
