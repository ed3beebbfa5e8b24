"""Example values of a captured graph: every placeholder and every tensor-valued node carries
`meta["example_value"]`, a meta tensor with the sizes, strides and dtype of the value eager
computed (what torch.compile's graphs carry for backends). The capture writes them after the
traced call has run; these tests check they still describe the real values, views and
parameters included, and that the compiled module matches eager."""

import torch
import torch.fx as fx
import torch.nn as nn

import kiln


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.register_buffer("scale", torch.rand(8, dtype=torch.float64))

    def forward(self, x):
        y = self.fc(x).transpose(0, 1)  # a view with other strides
        z = y.double() * self.scale[:, None]
        a, b = z.split([3, 5], dim=0)  # a tuple result: one node an item
        return a.sum(0), b.t().contiguous(), (x > 0).sum()


class _RealValues(fx.Interpreter):
    """Runs a graph and keeps every node's real value."""

    def __init__(self, gm):
        super().__init__(gm)
        self.values = {}

    def run_node(self, n):
        out = super().run_node(n)
        self.values[n] = out
        return out


def test_every_tensor_node_has_an_example_value_like_its_real_value():
    torch.manual_seed(0)
    mod = Net().eval()
    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    cm = kiln.compile(mod, backend=backend)
    for _ in range(3):
        x = torch.randn(4, 6)
        with torch.no_grad():
            for got, want in zip(cm(x), mod(x)):
                torch.testing.assert_close(got, want)
    ((gm, example_inputs),) = seen
    runner = _RealValues(gm)
    with torch.no_grad():
        runner.run(*example_inputs)
    checked = 0
    for n, real in runner.values.items():
        if not isinstance(real, torch.Tensor):
            continue
        example = n.meta["example_value"]
        assert example.device.type == "meta", n
        assert example.shape == real.shape, (n, example.shape, real.shape)
        assert example.stride() == real.stride(), (n, example.stride(), real.stride())
        assert example.dtype == real.dtype, (n, example.dtype, real.dtype)
        checked += 1
    assert checked >= 10, checked
