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
