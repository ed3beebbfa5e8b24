"""Metadata reads and storage bounds of inputs with symbolic sizes (capture/dynamic_metadata.py,
DynamicShapes._own_storage): one dynamic entry serves every size, with eager's results."""

import pytest
import torch

import kiln


def _compiled(fn):
    return kiln.compile(fn, dynamic=True)


def _entries(compiled) -> int:
    return compiled._kiln_compiled.compiles


def test_stride_read_follows_the_call_size():
    # the stride of a contiguous input depends on its size: reading it must not bake in the
    # first call's number (this computed with stride 16 at every length before)
    def f(x):
        return x.as_strided((x.size(0), x.size(1) - 1), (x.stride(0), 1)) * 2

    g = _compiled(f)
    for n in (16, 21, 30, 47):
        x = torch.randn(6, n)
        torch.testing.assert_close(g(x), f(x))
    assert _entries(g) == 1


def test_stride_tuple_and_nbytes_are_symbolic():
    def f(x):
        s0, s1 = x.stride()
        scale = x.nbytes / x.element_size()  # numel, through the byte count
        return x.view(-1)[:: s1 + 1] * s0 + scale

    g = _compiled(f)
    for n in (5, 9, 14):
        x = torch.randn(3, n)
        torch.testing.assert_close(g(x), f(x))
    assert _entries(g) == 1


def test_fake_of_an_input_owns_a_storage_of_its_symbolic_extent():
    # a bounds check against the input's storage (here `set_`; on CUDA, GPT-2's and Llama's
    # graphs) must not pin the entry to sizes up to the first dynamic call's: before, the fake's
    # storage had the first call's 640 bytes and the check added `32*s0 <= 640`
    from kiln.capture.dynamic import DynamicShapes

    class Src:
        def expr(self, namer):
            return "x"

    dyn = DynamicShapes()
    fake = dyn.fake_input(torch.randn(8, 20), Src(), {1})
    n = fake.size(1)
    assert fake.storage_offset() == 0
    assert fake.untyped_storage().nbytes() == 32 * n  # symbolic, not the first call's 640
    with dyn.fake_mode:
        torch.empty(0).set_(fake.untyped_storage(), 0, (8, n), (n, 1))
    assert not any("640" in str(g.expr) for g in dyn.shape_env.guards)


def test_view_input_keeps_its_base_storage():
    # a slice of a bigger tensor does not own its storage: still correct at every size
    def f(x):
        return x.as_strided((2, 3), (x.stride(0), 1), x.storage_offset()) + 1

    g = _compiled(f)
    base = torch.randn(10, 32)
    for n in (6, 9, 13):
        x = base[1:4, 2 : 2 + n]
        torch.testing.assert_close(g(x), f(x))


@pytest.mark.parametrize("same", [True, False])
def test_is_same_size_guards_its_outcome(same):
    def f(a, b):
        if a.is_same_size(b):
            return a + b
        return a.sum() + b.sum()

    g = _compiled(f)
    for n in (4, 7, 11):
        a = torch.randn(3, n)
        b = torch.randn(3, n if same else n + 1)
        torch.testing.assert_close(g(a, b), f(a, b))
    # the other outcome is a call the entries' guards do not admit: recompiled, still right
    a, b = torch.randn(3, 5), torch.randn(3, 6 if same else 5)
    torch.testing.assert_close(g(a, b), f(a, b))


def test_dense_permuted_input_keeps_its_layout_symbolically():
    # a channels-last input owns its storage too: its fake's strides are products of its
    # symbolic sizes in its own layout order, and the results match eager at every size
    def f(x):
        return (x * x.stride(1)).sum(dim=(2, 3)) + x.permute(0, 2, 3, 1).reshape(x.size(0), -1)[
            :, :3
        ]

    g = _compiled(f)
    for hw in (4, 6, 9):
        x = torch.randn(2, 3, hw, hw).contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(g(x), f(x))
