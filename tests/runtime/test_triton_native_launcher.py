"""kiln's generic native launch of Triton kernels (runtime/triton_native_launcher.py and
native_launch.cpp): which kernels it takes, that Triton's launcher takes the rest, that bad
calls are refused before any CUDA call (these run on the CPU machine); and, marked `gpu`, that
kernels of every scalar type launched through it compute exactly what they should, with no C
launcher built anywhere."""

import glob
import types

import pytest
import torch

from kiln import native
from kiln.runtime import triton_native_launcher as tnl


def _meta(**kw):
    base = dict(
        num_ctas=1,
        launch_cooperative_grid=False,
        launch_pdl=False,
        global_scratch_size=0,
        profile_scratch_size=0,
        tensordesc_meta=None,
    )
    return types.SimpleNamespace(**{**base, **kw})


def test_codes_follow_the_signature_in_order():
    sig = {"out": "*fp32", "x": "*bf16", "n": "i32", "m": "i64", "s": "fp32", "B": "constexpr"}
    assert tnl.codes(sig) == b"ppilfc"
    small = {"a": "i1", "b": "i8", "c": "u8", "d": "i16", "e": "u16", "f": "u32", "g": "u64"}
    assert tnl.codes(small) == b"bbBhHIL"
    assert tnl.codes({"h": "fp16", "k": "bf16", "d": "fp64"}) == b"ead"


def test_tuples_and_tensor_descriptors_are_not_taken():
    assert tnl.codes({"t": ("*fp32", "i32")}) is None
    assert tnl.codes({"d": "tensordesc<fp32[16, 16]>"}) is None
    assert tnl.codes({"t": "nvTmaDesc"}) is None


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_ctas", 2),
        ("launch_cooperative_grid", True),
        ("launch_pdl", True),
        ("global_scratch_size", 64),
        ("profile_scratch_size", 8),
        ("tensordesc_meta", [{}]),
    ],
)
def test_kernels_that_launch_otherwise_keep_tritons_launcher(field, value):
    made = []

    def fallback(src, metadata):
        made.append(src)
        return "triton's"

    make = tnl.launcher_class(lambda *a: None, fallback)
    src = types.SimpleNamespace(signature={"x": "*fp32", "n": "i32"})
    assert tnl.plain_launch(_meta())
    assert not tnl.plain_launch(_meta(**{field: value}))
    assert make(src, _meta(**{field: value})) == "triton's"
    assert made == [src]


def test_a_source_without_a_signature_keeps_tritons_launcher():
    make = tnl.launcher_class(lambda *a: pytest.fail("native"), lambda src, m: "triton's")
    assert make(types.SimpleNamespace(), _meta()) == "triton's"


def test_a_plain_kernel_gets_the_native_launcher_with_its_codes_bound():
    calls = []
    make = tnl.launcher_class(lambda *a: calls.append(a), lambda *a: pytest.fail("fallback"))
    launcher = make(types.SimpleNamespace(signature={"x": "*fp32", "n": "i32"}), _meta())
    assert isinstance(launcher, tnl.NativeLauncher)
    assert launcher.global_scratch_size == launcher.profile_scratch_size == 0
    launcher(4, 1, 1, 0, 99, (4, 1, 0), None, None, None, 123, 7)
    assert calls == [
        (b"pi", 4, 1, 1, 0, 99, False, False, None, None, (4, 1, 0), None, None, None, 123, 7)
    ]


def test_a_kernel_past_the_native_parameter_cap_keeps_tritons_launcher():
    # a GPT-2-small AdamW step made a one-row kernel of 593 parameters; the native launch packs
    # at most MAX_PARAMS and raised on every launch of it
    make = tnl.launcher_class(lambda *a: pytest.fail("native"), lambda src, m: "triton's")
    many = {f"p{k}": "*fp32" for k in range(tnl.MAX_PARAMS + 1)}
    assert make(types.SimpleNamespace(signature=many), _meta()) == "triton's"
    at_cap = {f"p{k}": "*fp32" for k in range(tnl.MAX_PARAMS)}
    native_made = tnl.launcher_class(lambda *a: None, lambda *a: pytest.fail("fallback"))
    assert isinstance(
        native_made(types.SimpleNamespace(signature=at_cap), _meta()), tnl.NativeLauncher
    )


def test_the_native_launch_refuses_bad_calls_before_touching_cuda():
    assert native.wait(), f"the native module did not build: {native.status()}"
    launch = native._state["module"].launch
    head = (1, 1, 1, 0, 0, False, False, None, None, (4, 1, 0), None, None, None)
    with pytest.raises(TypeError, match="2 kernel arguments for a signature of 3"):
        launch(b"ppi", *head, 1, 2)
    with pytest.raises(ValueError, match="cooperative"):
        launch(b"p", 1, 1, 1, 0, 0, True, False, None, None, (4, 1, 0), None, None, None, 1)
    with pytest.raises(ValueError, match="clusters"):
        launch(b"p", 1, 1, 1, 0, 0, False, False, None, None, (4, 2, 0), None, None, None, 1)
    with pytest.raises(TypeError):
        launch("p", *head, 1)  # codes are bytes
    many = tnl.MAX_PARAMS + 1
    with pytest.raises(ValueError, match=f"a signature of {many} parameters, more than the"):
        launch(b"p" * many, *head, *range(many))


# -- on the GPU -------------------------------------------------------------------------------


def _gpu_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from kiln.runtime.triton_interpret import is_interpreting

    if is_interpreting():
        pytest.skip("TRITON_INTERPRET is set; GPU tests compile for the GPU (run with -m gpu)")
    if not tnl.available():
        pytest.skip(f"kiln's native launch is not available here: {native.status()}")


@pytest.mark.gpu
def test_every_scalar_type_reaches_the_kernel_exactly(tmp_path, monkeypatch):
    _gpu_or_skip()
    import triton
    import triton.language as tl
    import triton.runtime.build as build

    from kiln.runtime.triton_launch import FastKernel

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    builds = []
    real_build = build._build
    monkeypatch.setattr(
        build, "_build", lambda *a, **kw: builds.append(a[0]) or real_build(*a, **kw)
    )

    @triton.jit(do_not_specialize=["d", "e", "f"])
    def mixed(
        out_ptr, x_ptr, a: tl.int8, b: tl.uint8, c: tl.int16, d: tl.int32, e: tl.int64,
        f: tl.uint32, g: tl.float16, h: tl.bfloat16, i: tl.float32, j: tl.float64,
        flag: tl.int1, N: tl.constexpr,
    ):  # fmt: skip
        tl.store(out_ptr + 0, a.to(tl.float64))
        tl.store(out_ptr + 1, b.to(tl.float64))
        tl.store(out_ptr + 2, c.to(tl.float64))
        tl.store(out_ptr + 3, d.to(tl.float64))
        tl.store(out_ptr + 4, e.to(tl.float64))
        tl.store(out_ptr + 5, f.to(tl.float64))
        tl.store(out_ptr + 6, g.to(tl.float64))
        tl.store(out_ptr + 7, h.to(tl.float64))
        tl.store(out_ptr + 8, i.to(tl.float64))
        tl.store(out_ptr + 9, j)
        tl.store(out_ptr + 10, flag.to(tl.float64))
        offs = tl.arange(0, N)
        tl.store(out_ptr + 16 + offs, tl.load(x_ptr + offs).to(tl.float64) * 2)

    @triton.jit
    def pointers_only(out_ptr, x_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) + 1)

    x = torch.randn(16, device="cuda")
    scalars = (
        -7,
        200,
        -30000,
        -2_000_000_000,
        2**40 + 3,
        3_000_000_000,
        1.5,
        -2.75,
        0.1,
        1e300,
        True,
    )
    want = torch.tensor(
        [-7, 200, -30000, -2_000_000_000, 2**40 + 3, 3_000_000_000, 1.5, -2.75,
         float(torch.tensor(0.1, dtype=torch.float32)), 1e300, 1.0],
        dtype=torch.float64,
    )  # fmt: skip
    fast = FastKernel(mixed)
    for _ in range(3):  # the first launch goes through Triton, the next straight to the launch
        out = torch.zeros(32, dtype=torch.float64, device="cuda")
        x = torch.randn(16, device="cuda")
        fast[(1,)](out, x, *scalars, N=16)
        torch.testing.assert_close(out[:11].cpu(), want, rtol=0, atol=0)
        torch.testing.assert_close(out[16:], x.double() * 2, rtol=0, atol=0)
    launch = fast._launches[(1,)]
    assert isinstance(launch.compiled.run, tnl.NativeLauncher)

    fast2 = FastKernel(pointers_only)
    for _ in range(3):
        x = torch.randn(64, device="cuda")
        out = torch.empty_like(x)
        fast2[(1,)](out, x, N=64)
        torch.testing.assert_close(out, x + 1, rtol=0, atol=0)
    assert fast2._launches[(1,)].raw is not None  # tensors only: the raw path, also native
    assert [b for b in builds if "launcher" in b] == []
    assert glob.glob(str(tmp_path / "**" / "__triton_launcher*"), recursive=True) == []
