"""runtime/triton_launch.py on a real GPU: the raw launch path gives Triton's results, a
misaligned view or a launch hook takes Triton's own path, and every call is right.

    PYTHONPATH=src python3 -m pytest -m gpu tests/runtime/test_triton_launch.py
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    pytest.importorskip("triton")
    from kiln.runtime.triton_interpret import is_interpreting

    if is_interpreting():
        pytest.skip("TRITON_INTERPRET is set; this test launches compiled kernels")


def _axpy():
    import triton
    import triton.language as tl

    @triton.jit
    def axpy(x_ptr, y_ptr, out_ptr, n, XBLOCK: tl.constexpr):
        offs = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, 2.0 * x + y, mask=mask)

    return axpy


def _launch(kernel, x, y, out):
    kernel[(4,)](x, y, out, 1000, XBLOCK=256, num_warps=4)


def test_later_launches_are_raw_and_right():
    from kiln.runtime.triton_launch import FastKernel

    kernel = FastKernel(_axpy())
    launch = kernel[(4,)]
    for i in range(5):
        x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
        out = torch.empty(1000, device="cuda")
        _launch(kernel, x, y, out)
        torch.testing.assert_close(out, 2 * x + y)
        if i == 0:
            assert launch.compiled is not None
    # an integer (size) argument launches raw too, its specialization class checked per launch
    assert launch.raw is not None and launch.ints == (3,)


def test_size_arguments_of_one_launch_change_specialization_and_stay_right():
    """A kernel compiled for symbolic sizes takes them as integer arguments; one grid's launch
    sees lengths Triton specializes differently (divisible by 16, not, 1): each runs the
    variant for its own class, through the kept CompiledKernel when the class matches."""
    from kiln.runtime.triton_launch import FastKernel

    kernel = FastKernel(_axpy())
    launch = kernel[(4,)]
    for n in (1000, 1008, 1024, 1, 999, 1000, 1, 2, 1008, 1):
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        out = torch.full((n,), float("nan"), device="cuda")
        launch(x, y, out, n, XBLOCK=256, num_warps=4)
        torch.testing.assert_close(out, 2 * x + y)
    assert launch.compiled is not None
    assert launch.raw is not None  # the first class's launches (1000, 999, 2) went raw


def _copy2():
    import triton
    import triton.language as tl

    @triton.jit
    def copy2(x_ptr, out_ptr, XBLOCK: tl.constexpr):
        offs = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) * 2.0)

    return copy2


def test_tensor_only_kernel_launches_raw_and_falls_back_for_misaligned_views():
    from kiln.runtime.triton_launch import FastKernel

    kernel = FastKernel(_copy2())
    launch = kernel[(2,)]
    base = torch.randn(1024 + 1, device="cuda")
    for _ in range(3):
        x = torch.randn(512, device="cuda")
        out = torch.empty(512, device="cuda")
        launch(x, out, XBLOCK=256, num_warps=4)
        torch.testing.assert_close(out, x * 2)
    assert launch.raw is not None, "an all-tensor, aligned kernel should launch raw"
    x = base[1:513]  # 4-byte offset: not 16-byte aligned, another specialization
    out = torch.empty(512, device="cuda")
    launch(x, out, XBLOCK=256, num_warps=4)
    torch.testing.assert_close(out, x * 2)
    x = torch.randn(512, device="cuda")
    launch(x, out, XBLOCK=256, num_warps=4)  # and back to the raw path
    torch.testing.assert_close(out, x * 2)


def test_launch_hooks_see_every_launch():
    from triton import knobs

    from kiln.runtime.triton_launch import FastKernel

    kernel = FastKernel(_copy2())
    launch = kernel[(2,)]
    x, out = torch.randn(512, device="cuda"), torch.empty(512, device="cuda")
    launch(x, out, XBLOCK=256, num_warps=4)
    seen = []
    hook = knobs.runtime.launch_enter_hook

    def record(meta):
        seen.append(meta)

    hook.add(record)
    try:
        for _ in range(3):
            launch(x, out, XBLOCK=256, num_warps=4)
    finally:
        hook.remove(record)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x * 2)
    assert len(seen) == 3


def test_wrapper_style_launches_go_through_the_bound_launch():
    """`kernel[grid](...)` as the wrapper writes it: after the first launch the grid's entry is
    the native bound launch; every result is right, a misaligned view and a launch hook take
    the Python path, and the bound launch serves again after them."""
    from triton import knobs

    from kiln.runtime import triton_native_launcher as tnl
    from kiln.runtime.triton_launch import FastKernel

    if not tnl.available():
        pytest.skip("kiln's native launch is not available here")
    kernel = FastKernel(_copy2())
    base = torch.randn(1024 + 1, device="cuda")
    seen = []
    for i in range(8):
        x = base[1:513] if i == 4 else torch.randn(512, device="cuda")
        out = torch.empty(512, device="cuda")
        if i == 6:
            knobs.runtime.launch_enter_hook.add(seen.append)
        try:
            kernel[(2,)](x, out, XBLOCK=256, num_warps=4)
        finally:
            knobs.runtime.launch_enter_hook.remove(seen.append)
        torch.testing.assert_close(out, x * 2)
        if i == 0:
            assert type(kernel[(2,)]).__name__ == "BoundLaunch"
    assert len(seen) == 1  # the one launch made while the hook was set
    assert kernel._launches[(2,)].raw is not None
    # the bound launch is invisible to the garbage collector: nothing may cycle through it
    import gc

    from kiln.runtime.triton_launch import _Launch

    jit = kernel.jit
    del kernel
    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, _Launch) and o.jit is jit]


# -- kernels with integer (size) arguments through the native bound launch --------------------


def _shifted():
    import triton
    import triton.language as tl

    @triton.jit
    def shifted(x_ptr, out_ptr, meta_ptr, n, shift, big, XBLOCK: tl.constexpr):
        offs = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + shift, mask=mask)
        if tl.program_id(0) == 0:  # the integers as the kernel received them, exactly
            tl.store(meta_ptr + 0, n)
            tl.store(meta_ptr + 1, shift)
            tl.store(meta_ptr + 2, big)

    return shifted


def _count_python_launches(monkeypatch) -> list:
    """Every call of the Python `_Launch` (the first launch of a grid, and what a bound launch
    hands on), recorded with its size argument; a launch the bound one makes itself adds
    nothing."""
    from kiln.runtime import triton_launch

    calls: list = []
    real = triton_launch._Launch.__call__

    def counted(self, *args, **kwargs):
        calls.append(args[3] if len(args) > 3 else args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(triton_launch._Launch, "__call__", counted)
    return calls


def _run_shifted(kernel, grid, n: int, shift: int, big: int) -> None:
    x = torch.randn(1024, device="cuda")
    out = torch.full((1024,), float("nan"), device="cuda")
    meta = torch.zeros(3, dtype=torch.int64, device="cuda")
    kernel[grid](x, out, meta, n, shift, big, XBLOCK=256, num_warps=4)
    torch.testing.assert_close(out[:n], x[:n] * 2.0 + shift)
    assert out[n:].isnan().all(), "the kernel wrote past its size"
    assert meta.tolist() == [n, shift, big]


SIZES = (1, 2, 15, 16, 17, 33, 1000)


@pytest.mark.parametrize("n", SIZES)
def test_size_arguments_launch_through_the_bound_launch(n, monkeypatch):
    """A kernel with size arguments, at its size (1: Triton's constexpr; 16: divisible; the
    others not) and a grid covering it: after its first launch the grid's entry is the native
    `BoundLaunch`, which packs `n`, a 32-bit `shift` and a 64-bit `big` exactly and launches
    with no Python frame (only the first launch and the call that records the call site's
    keywords reach the Python `_Launch`); every result is right."""
    from kiln.runtime import triton_native_launcher as tnl
    from kiln.runtime.triton_launch import FastKernel

    if not tnl.available():
        pytest.skip("kiln's native launch is not available here")
    calls = _count_python_launches(monkeypatch)
    kernel = FastKernel(_shifted())
    grid = ((n + 255) // 256,)
    for i in range(6):  # shifts of one class (odd, 32 bits), bigs of one (64 bits, 16 | big)
        _run_shifted(kernel, grid, n, 3 + 2 * i, 2**33 + 16 * i)
        if i == 0:
            assert type(kernel[grid]).__name__ == "BoundLaunch"
    assert calls == [n, n], "launches after the second went through Python"


def test_sizes_of_other_classes_at_one_grid_each_get_a_bound_variant(monkeypatch):
    """One grid, sizes of every class in turn (not divisible by 16, divisible, 1, past 32
    bits): each class's first launch goes to Triton's path, which compiles its variant, and
    that variant is bound too; all results are right, and once every class has been seen
    (and its bound launch has recorded the call site) no launch goes through Python."""
    from kiln.runtime import triton_native_launcher as tnl
    from kiln.runtime.triton_launch import _VARIANTS, FastKernel, int_class

    if not tnl.available():
        pytest.skip("kiln's native launch is not available here")
    calls = _count_python_launches(monkeypatch)
    kernel = FastKernel(_shifted())
    sizes = (1000, 17, 16, 1, 2, 15, 33, 1000, 16, 1, 999, 17, 2**31 + 8, 2**31 + 8)
    assert len({int_class(n) for n in sizes}) == _VARIANTS == 4
    for n in sizes:
        _run_shifted(kernel, (4,), n, 5, 2**33)
    assert type(kernel[(4,)]).__name__ == "BoundLaunch"
    assert len(kernel._launches[(4,)].bound) == 4
    # each class's first launch went through Python (and Triton's path); a launch whose class
    # was bound before may have gone either way (a new bound launch's first call is handed on)
    assert {int_class(n) for n in calls} == {int_class(n) for n in sizes}
    calls.clear()
    for i, n in enumerate(sizes):
        _run_shifted(kernel, (4,), n, 7 + 2 * i, 2**33 + 16 * i)
    assert calls == [], "a class seen before went through Python"


def test_compiled_dynamic_sizes_launch_with_no_python_frame(monkeypatch):
    """`kiln.compile(dynamic=True)` on CUDA: the wrapper passes sizes to its kernels; once a
    length has been seen, a call at it makes no Python launch at all, and matches eager."""
    import kiln
    from kiln.runtime import triton_native_launcher as tnl

    if not tnl.available():
        pytest.skip("kiln's native launch is not available here")

    def f(x, w):
        return torch.nn.functional.gelu(x * w + 1.0).sum(-1), (x - x.mean(-1, keepdim=True))

    compiled = kiln.compile(f, dynamic=True)
    w = torch.randn(64, device="cuda")
    calls = _count_python_launches(monkeypatch)
    for n in SIZES:
        # a call that compiles runs the function while capturing it (no compiled launch), the
        # next launches through Triton's path, the one after records the call site: by the
        # fourth call at a length, no launch may go through Python
        for k in range(4):
            x = torch.randn(n, 64, device="cuda")
            before = len(calls)
            got, want = compiled(x, w), f(x, w)
            for g, e in zip(got, want):
                torch.testing.assert_close(g, e)
            if k == 3:
                assert len(calls) == before, f"length {n}: launches through Python"
