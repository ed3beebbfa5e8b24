"""Device graphs (runtime/device_graphs.py): CPU fallback logic here; capture/replay on the GPU.

GPU tests carry `@pytest.mark.gpu`: `PYTHONPATH=src python3 -m pytest -m gpu <this file> -q`.
Every result is compared with eager PyTorch on fresh random inputs.
"""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln import logs
from kiln.runtime import device_graphs as dg
from kiln.runtime.device_graphs_outputs import Generation, GraphOutput, OverwrittenOutputError

gpu = pytest.mark.gpu


@pytest.fixture
def hints(monkeypatch):
    seen: list[str] = []
    real = logs.once

    def once(key, artifact, message):
        new = real(key, artifact, message)
        if new and artifact == "perf_hints":
            seen.append(message)
        return new

    monkeypatch.setattr(dg.logs, "once", once)
    return seen


def _fn(x, w):
    return (torch.relu(x @ w) + 1,)


def test_cpu_falls_back_transparently_and_says_why(hints):
    g = dg.graphed(_fn)
    w = torch.randn(8, 4)
    for _ in range(3):
        x = torch.randn(5, 8)
        (out,) = g([x, w])
        torch.testing.assert_close(out, _fn(x, w)[0])
        assert type(out) is torch.Tensor
    assert not g.recorded
    assert len([h for h in hints if "CPU tensors" in h]) == 1


def test_boxed_inner_callable_gets_a_list_and_caller_list_is_emptied():
    calls = []

    def boxed(args):
        calls.append(len(args))
        x, y = args
        args.clear()
        return [x * y]

    boxed._boxed_call = True
    g = dg.graphed(boxed)
    x, y = torch.randn(3), torch.randn(3)
    args = [x, y]
    (out,) = g(args)
    assert args == [] and calls == [2]
    torch.testing.assert_close(out, x * y)


def test_graph_output_raises_after_its_graph_replayed():
    gen = Generation("f")
    static = torch.randn(4)
    out = GraphOutput.wrap(static, gen)
    torch.testing.assert_close(out + 1, static + 1)
    assert type(out + 1) is torch.Tensor  # the subclass does not spread
    gen.count += 1
    with pytest.raises(OverwrittenOutputError, match=r"clone\(\)|mark_step_begin"):
        out.sum()
    with pytest.raises(OverwrittenOutputError):
        torch.add(static, out)
    fresh = GraphOutput.wrap(static, gen)
    torch.testing.assert_close(fresh * 2, static * 2)


@pytest.mark.parametrize("how", [{"backend": "cudagraphs"}, {"mode": "reduce-overhead"}])
def test_backends_train_correctly_on_cpu(how):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    ref = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    ref.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, **how)
    for _ in range(3):
        x = torch.randn(4, 6)
        out, expected = compiled(x), ref(x)
        torch.testing.assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad = q.grad = None


def test_mark_step_begin_is_public():
    before = dg.current_step()
    kiln.mark_step_begin()
    assert dg.current_step() == before + 1


def _bn_net(device="cpu"):
    return (
        torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
        .to(device)
        .eval()
    )


def test_parameters_and_buffers_are_static_positions_of_the_group():
    """Capture names the model's parameters and buffers; the device-graph group gets their
    positions among the tensor inputs the AOT graphs take (a Python number input between
    them does not shift the count)."""
    from kiln.backends.builtin import _device_graph_group
    from kiln.contracts import takes_capture_info

    net = _bn_net()
    groups, metas = [], []

    @takes_capture_info
    def backend(gm, example_inputs, info):
        metas.append((info.static_inputs, list(example_inputs)))
        groups.append(_device_graph_group(gm, info))
        return gm.forward

    def f(x, scale):
        return net(x) * scale

    compiled = kiln.compile(f, backend=backend, dynamic=True)
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(compiled(x, 2.0), f(x, 2.0))
    (held, inputs), (group,) = metas[0], groups[:1]
    state = {id(t) for t in [*net.parameters(), *net.buffers()]}
    assert {i for i, t in enumerate(inputs) if id(t) in state} == set(held)
    assert len(held) == 6  # conv weight and bias; bn weight, bias, running mean and variance
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    assert {id(tensors[k]) for k in group.static_inputs} == {id(inputs[i]) for i in held}
    assert id(x) not in {id(tensors[k]) for k in group.static_inputs}


# -- GPU ---------------------------------------------------------------------------------------


def _mlp(width=64, out=8, device="cuda"):
    return torch.nn.Sequential(
        torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, out)
    ).to(device)


@gpu
def test_replay_matches_eager_over_changing_values():
    model = _mlp()
    g = dg.graphed(lambda x, *ps: (model(x),))
    params = list(model.parameters())
    with torch.no_grad():
        for i in range(5):
            x = torch.randn(16, 32, device="cuda")
            (out,) = g([x, *params])
            torch.testing.assert_close(out, model(x))
            assert (i >= 1) == bool(g.recorded)
            assert isinstance(out, GraphOutput) == (i >= 1)


@gpu
def test_parameters_are_used_in_place_not_copied():
    w = torch.nn.Parameter(torch.randn(32, 32, device="cuda"))
    g = dg.graphed(lambda x, w: (x @ w,))
    x = torch.randn(4, 32, device="cuda")
    with torch.no_grad():
        g([x, w]), g([x, w])
        (rec,) = g.recorded.values()
        assert rec.static_inputs[1].data_ptr() == w.data_ptr()
        assert rec.static_inputs[0].data_ptr() != x.data_ptr()
        w.mul_(2)  # an optimizer step: the graph must see it without a copy
        x2 = torch.randn(4, 32, device="cuda")
        (out,) = g([x2, w])
        torch.testing.assert_close(out, x2 @ w)


@gpu
def test_mutated_input_falls_back(hints):
    def f(x, y):
        x.add_(1)
        return (x * y,)

    g = dg.graphed(f)
    for _ in range(3):
        x, y = torch.randn(8, device="cuda"), torch.randn(8, device="cuda")
        x_ref = x.clone()
        (out,) = g([x, y])
        torch.testing.assert_close(out, (x_ref + 1) * y)
        torch.testing.assert_close(x, x_ref + 1)
    assert not g.recorded and any("mutates" in h for h in hints)


@gpu
def test_shape_limit_falls_back(hints):
    g = dg.graphed(lambda x: (x.sin() * 2,), dg.GraphGroup(max_shapes=2))
    for n in (3, 3, 4, 4, 5, 5, 5):
        x = torch.randn(n, device="cuda")
        (out,) = g([x])
        torch.testing.assert_close(out, x.sin() * 2)
    assert len(g.recorded) == 2
    assert any("more than 2 input signatures" in h for h in hints)


@gpu
def test_capture_error_falls_back(hints):
    g = dg.graphed(lambda x: (x * x.sum().item(),))  # .item() syncs: not capturable
    for _ in range(3):
        x = torch.randn(8, device="cuda")
        (out,) = g([x])
        torch.testing.assert_close(out, x * x.sum().item())
    assert any("capture failed" in h for h in hints)


@gpu
def test_reading_an_overwritten_output_raises():
    g = dg.graphed(lambda x: (x * 3,))
    g([torch.randn(8, device="cuda")])  # warm-up
    x1 = torch.randn(8, device="cuda")
    (out1,) = g([x1])
    kept = out1.clone()
    (out2,) = g([torch.randn(8, device="cuda")])
    with pytest.raises(OverwrittenOutputError, match="clone"):
        print(out1)
    torch.testing.assert_close(kept, x1 * 3)
    assert out2.sum().isfinite()


@gpu
def test_an_overwritten_output_passed_to_a_graph_raises():
    """A graphed callable reads its arguments without `GraphOutput`'s per-access test (host
    time), so it checks each argument once on entry instead: an overwritten output given back
    to a graph (its own or another's) still raises, before anything is copied."""
    g = dg.graphed(lambda x: (x * 3,))
    h = dg.graphed(lambda x: (x + 1,))
    for _ in range(2):  # warm-up, record
        g([torch.randn(8, device="cuda")])
        h([torch.randn(8, device="cuda")])
    (out1,) = g([torch.randn(8, device="cuda")])
    (ok,) = h([out1])  # still valid: used in place of a fresh input
    torch.testing.assert_close(ok, out1.clone() + 1)
    g([torch.randn(8, device="cuda")])  # overwrites out1
    for graph in (g, h):
        with pytest.raises(OverwrittenOutputError, match="clone"):
            graph([out1])


@gpu
@pytest.mark.parametrize("how", [{"backend": "cudagraphs"}, {"mode": "reduce-overhead"}])
def test_training_step_with_graphs_matches_eager(how):
    torch.manual_seed(0)
    model = _mlp()
    ref = _mlp()
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    compiled = kiln.compile(model, **how)
    for _ in range(5):
        x = torch.randn(16, 32, device="cuda")
        for m, o in ((compiled, opt), (ref, ref_opt)):
            o.zero_grad(set_to_none=True)
            m(x).square().mean().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        opt.step()
        ref_opt.step()
    x = torch.randn(16, 32, device="cuda")
    torch.testing.assert_close(compiled(x), ref(x))


@gpu
def test_another_graphs_output_is_read_in_place_and_never_written(hints):
    """A backward reads its forward's saved values where the forward's replay writes them (no
    copy each step); a call passing another tensor at such a position runs without the graph
    rather than copy into the forward's output buffer."""
    fw = dg.graphed(lambda x: (x * 2, x.sin()))
    bw = dg.graphed(lambda saved, t: (saved * t,))
    for _ in range(4):
        x, t = torch.randn(8, device="cuda"), torch.randn(8, device="cuda")
        _, saved = fw([x])
        (out,) = bw([saved, t])
        torch.testing.assert_close(out, x.sin() * t)
    (rec,) = bw.recorded.values()
    assert rec.borrowed == {0}
    assert rec.static_inputs[0].data_ptr() == saved.data_ptr()
    kept = saved.clone()
    other = torch.randn(8, device="cuda")
    (out,) = bw([other, t])
    torch.testing.assert_close(out, other * t)
    torch.testing.assert_close(saved, kept)  # the forward's buffer was not written
    assert any("recorded in place" in h for h in hints)


def _peak(batches, model) -> int:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    params = list(model.parameters())
    g = dg.graphed(lambda x, *ps: (model(x),))
    with torch.no_grad():
        for b in batches:
            for _ in range(3):  # warm-up, capture + replay, replay
                x = torch.randn(b, 256, device="cuda")
                (out,) = g([x, *params])
            torch.testing.assert_close(out, model(x))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del g, out
    return peak


@gpu
def test_five_shapes_cost_at_most_one_and_a_half_of_the_largest():
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
        torch.nn.ReLU(), torch.nn.Linear(4096, 16),
    ).cuda()  # fmt: skip
    # cuBLAS keeps one workspace per stream it ran on (the warm-up and capture streams, made
    # once per process): create them first so that neither figure below pays for them.
    _peak([64], model)
    largest = _peak([2048], model)
    five = _peak([256, 512, 1024, 1536, 2048], model)
    assert five <= 1.5 * largest, (five, largest)


@gpu
def test_reduce_overhead_reads_buffers_in_place():
    """Batch-norm running statistics are buffers: replays read them where they are (no copy
    each replay), and a changed statistic is seen by the next replay."""
    net = _bn_net("cuda")
    before = {id(g) for g in _graphed_callables()}
    compiled = kiln.compile(net, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 3, 16, 16, device="cuda")
            torch.testing.assert_close(compiled(x), net(x))
        graphed = [g for g in _graphed_callables() if g.recorded and id(g) not in before]
        assert graphed, "no device graph was recorded"
        for g in graphed:
            for rec in g.recorded.values():
                assert len(rec.copied) == 1, f"copied before each replay: {rec.copied}"
        net[1].running_mean.add_(0.5)  # in place, as a training step would
        x = torch.randn(4, 3, 16, 16, device="cuda")
        torch.testing.assert_close(compiled(x), net(x))


def _graphed_callables():
    import gc

    return [o for o in gc.get_objects() if isinstance(o, dg.GraphedCallable)]
