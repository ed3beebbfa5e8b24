"""Questions about a tensor that its metadata answers (`x.type()`, `.dtype`, `.device`,
`.is_cuda`, `.layout`, `.is_floating_point()`, `.element_size()`, `.dim()`, ...) are constants
of the trace, guarded by the inputs' tensor guards: one graph, no break, and a float64 input
recompiles to its own answers."""

import torch
from harness import CountingBackend, check


def _prog(x):
    y = x * 2
    if y.type() == "torch.FloatTensor":
        y = y + 1
    facts = (
        y.type(),
        y.dtype,
        y.device,
        y.is_cuda,
        y.layout,
        y.is_floating_point(),
        y.element_size(),
        y.dim(),
        y.ndimension(),
        y.is_contiguous(),
    )
    return y * facts[6], facts


def test_metadata_queries_are_constants():
    cf, _ = check(_prog, lambda: (torch.randn(3, 4),))
    assert not cf._kiln_compiled.breaks


def test_metadata_queries_follow_the_input_dtype():
    backend = CountingBackend()
    import kiln

    cf = kiln.compile(_prog, backend=backend)
    for dtype in (torch.float32, torch.float64, torch.float32, torch.float64):
        x = torch.randn(2, 3, dtype=dtype)
        got, expected = cf(x), _prog(x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] == expected[1]
    assert len(backend.graphs) == 2
    assert not cf._kiln_compiled.breaks


def test_type_with_a_dtype_is_a_conversion_in_the_graph():
    def prog(x):
        return x.type(torch.float64) * 3, x.type("torch.DoubleTensor").sum()

    check(prog, lambda: (torch.randn(4),))
