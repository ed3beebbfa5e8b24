"""Tests of kiln.bench.measure: the correctness check catches wrong compilers (outputs and
gradients), timing runs every step alike, the CPU memory measure sees allocations."""

from __future__ import annotations

import gc
import math

import pytest
import torch

from kiln.bench import measure, report, suite


@pytest.fixture(scope="module")
def models():
    return suite.load_models(suite.models_dir())


def _task(
    model: str,
    compiler: str = "custom",
    train: bool = False,
    dtype: str = "float32",
    with_eager: bool = False,
    size: str = "tiny",
):
    return suite.Task(
        model=model,
        compiler=compiler,
        mode="default",
        device="cpu",
        dtype=dtype,
        size=size,
        train=train,
        models_dir=str(suite.models_dir()),
        timing_s=0.01,
        with_eager=with_eager,
    )


def _off_by_a_percent(model, mode):
    def fn(*args):
        return model(*args) * 1.01

    return measure.Compiled(fn, lambda: (1, 0))


class _WrongGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def _wrong_gradients(model, mode):
    """Right outputs, doubled gradients: only a check of gradients can see it."""
    return measure.Compiled(lambda *args: _WrongGrad.apply(model(*args)), lambda: (1, 0))


def test_eager_compiler_is_correct_and_measured(models):
    (row,) = measure.run_task(_task("mlp", "eager"), models["mlp"], measure.compile_eager)
    assert row["correct"] is True, row["error"]
    assert row["error"] is None
    assert row["max_err"] == 0.0
    assert row["speedup_vs_eager"] == 1.0
    assert row["median_ms"] > 0
    assert row["peak_mem_bytes"] > 0
    assert (row["graphs"], row["graph_breaks"]) == (0, 0)
    assert row["steady_ms"] is None  # a CUDA figure: calls on the CPU are synchronous


@pytest.mark.gpu
def test_back_to_back_times_each_call_of_a_loop():
    """Back-to-back blocks: warm-up and timed calls of every step alike, each timed call's
    device time from its events; a step that queues 10x the work takes about 10x longer."""
    x = torch.randn(2048, 2048, device="cuda")
    calls = [0, 0]

    def small(inputs):
        calls[0] += 1
        return x @ x

    def large(inputs):
        calls[1] += 1
        for _ in range(10):
            x @ x

    small_ms, large_ms = measure.back_to_back_medians([small, large], ())
    per_step = measure.B2B_BLOCKS * (measure.B2B_WARMUP + measure.B2B_CALLS)
    assert calls == [per_step, per_step]
    assert 5 * small_ms < large_ms < 20 * small_ms


def test_wrong_output_is_caught(models):
    (row,) = measure.run_task(_task("mlp"), models["mlp"], _off_by_a_percent)
    assert row["correct"] is False
    assert "wrong result" in row["error"] and "output[0]" in row["error"]
    assert row["max_err"] > measure.TOLERANCES[torch.float32]
    assert row["compile_s"] is not None  # a wrong result is still timed and reported


def test_wrong_output_is_caught_in_bfloat16(models):
    (row,) = measure.run_task(
        _task("softmax_ln", dtype="bfloat16"),
        models["softmax_ln"],
        lambda m, mode: measure.Compiled(lambda x: m(x) * 1.25),
    )
    assert row["correct"] is False


def test_wrong_gradient_is_caught_in_training(models):
    (inference,) = measure.run_task(_task("nanogpt"), models["nanogpt"], _wrong_gradients)
    assert inference["correct"] is True, inference["error"]
    (row,) = measure.run_task(_task("nanogpt", train=True), models["nanogpt"], _wrong_gradients)
    assert row["correct"] is False
    assert "grad " in row["error"]


def test_training_step_matches_eager_with_buffers(models):
    # resnet has batch norm: a training step mutates running statistics, which are compared.
    (row,) = measure.run_task(
        _task("resnet", "eager", train=True), models["resnet"], measure.compile_eager
    )
    assert row["correct"] is True, row["error"]


def test_compiler_that_raises_becomes_an_error_row(models):
    def broken(model, mode):
        raise RuntimeError("no kernel for you")

    eager, row = measure.run_task(_task("pointwise", with_eager=True), models["pointwise"], broken)
    assert row["correct"] is False
    assert row["error"] == "compile: RuntimeError: no kernel for you"
    assert row["median_ms"] is None
    assert eager["compiler"] == "eager" and eager["error"] is None
    assert eager["median_ms"] > 0  # eager is still timed, on its own


def test_eager_row_comes_from_the_compiled_rows_process(models):
    task = _task("mlp", "kiln-like", train=True, with_eager=True)
    eager, row = measure.run_task(task, models["mlp"], _off_by_a_percent)
    assert (eager["compiler"], eager["mode"], eager["train"]) == ("eager", "default", True)
    assert eager["correct"] is True and row["correct"] is False
    assert eager["median_ms"] == row["eager_ms"]  # the eager half of the interleaved timing
    assert eager["speedup_vs_eager"] == 1.0
    assert eager["peak_mem_bytes"] > 0 and eager["compile_s"] is None


@pytest.mark.parametrize(
    "actual, expected, ok",
    [
        (torch.ones(3), torch.ones(3), True),
        (torch.ones(3), torch.ones(3) * 1.01, False),
        (torch.ones(3), torch.ones(4), False),
        (torch.ones(3, dtype=torch.float64), torch.ones(3), False),
        (torch.tensor([1.0, math.nan]), torch.tensor([1.0, math.nan]), True),
        (torch.tensor([1.0, math.nan]), torch.tensor([1.0, 2.0]), False),
        (torch.tensor([1, 2]), torch.tensor([1, 3]), False),
        (None, None, True),
        (None, torch.ones(2), False),
    ],
)
def test_compare(actual, expected, ok):
    good, err, why = measure.compare({"t": actual}, {"t": expected}, 1e-3)
    assert good is ok
    assert (why == "") is ok
    assert (err <= 1e-3) is ok


def test_compare_scales_by_the_largest_value():
    big = torch.tensor([1000.0, 1e-3])
    assert measure.compare({"t": big + 0.5}, {"t": big}, 1e-3)[0] is True
    assert measure.compare({"t": big + 2.0}, {"t": big}, 1e-3)[0] is False


def test_interleaved_medians_runs_every_step_alike():
    calls = [0, 0]
    steps = [
        lambda x: calls.__setitem__(0, calls[0] + 1),
        lambda x: calls.__setitem__(1, calls[1] + 1),
    ]
    medians = measure.interleaved_medians(steps, (), "cpu", budget_s=0.0, min_reps=7)
    assert len(medians) == 2 and all(m >= 0 for m in medians)
    assert calls[0] == calls[1] == 7 + 2  # two warm-up calls each, then the rounds


def test_cpu_peak_memory_sees_a_large_intermediate():
    class Big(torch.nn.Module):
        def forward(self, x):
            return (x.expand(1024, 1024) * 2.0).sum()  # a 4 MiB temporary

    module, x = Big(), torch.randn(1024)
    step = measure.Step(module, module, train=False, grads={})
    peak = measure.peak_memory(step, (x,), "cpu")
    assert peak >= 4 * 2**20 + x.numel() * 4
    assert peak < 64 * 2**20


@pytest.fixture
def kiln_logging_restored():
    """compile_kiln switches on two kiln logs and adds handlers (meant for a worker
    process); put the logging state back so later tests in this process see none of it."""
    import logging

    from kiln import logs

    root, breaks = logging.getLogger("kiln"), logging.getLogger("kiln.graph_breaks")
    hints = logging.getLogger("kiln.perf_hints")
    saved = (logs._enabled, list(root.handlers), root.propagate, root.level)
    saved_handlers = (list(breaks.handlers), list(hints.handlers))
    yield
    logs._enabled, root.handlers[:], root.propagate, level = saved
    breaks.handlers[:], hints.handlers[:] = saved_handlers
    root.setLevel(level)


def test_kiln_rows_count_graphs_through_a_wrapping_backend(models, kiln_logging_restored):
    (row,) = measure.run_task(_task("pointwise", "kiln"), models["pointwise"], measure.compile_kiln)
    assert row["correct"] is True, row["error"]
    assert row["graphs"] >= 1
    assert row["graph_breaks"] == len(row["break_reasons"]) == 0


def test_kiln_rows_give_kilns_backend_the_capture_facts_and_mode(
    kiln_logging_restored, monkeypatch
):
    """The counting backend passes capture's `CaptureInfo` on: without it kiln's backend ran
    with default options (no mode), checked input layouts capture had guarded already and
    computed AOT autograd's per-call key on every call."""
    from kiln.backends import registry
    from kiln.contracts import takes_capture_info

    seen = []
    real = registry.lookup_backend("inductor")

    @takes_capture_info
    def spy(gm, example_inputs, info=None):
        seen.append(info)
        return real(gm, example_inputs, info=info)

    monkeypatch.setitem(registry._backends, "inductor", spy)
    model = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.GELU(), torch.nn.Linear(20, 4))
    compiled = measure.compile_kiln(model, "reduce-overhead")
    x = torch.randn(3, 12)
    torch.testing.assert_close(compiled.fn(x), model(x))
    assert len(seen) == 1 and seen[0] is not None
    assert seen[0].options.mode == "reduce-overhead"
    assert seen[0].fixed_call_key and seen[0].static_inputs


def test_kiln_fallback_to_eager_kernels_is_recorded(models, kiln_logging_restored, monkeypatch):
    import kiln.codegen

    def refuse(*args, **kwargs):
        raise NotImplementedError("refused for this test")

    monkeypatch.setattr(kiln.codegen, "compile_graph", refuse)
    (row,) = measure.run_task(_task("pointwise", "kiln"), models["pointwise"], measure.compile_kiln)
    assert row["correct"] is True, row["error"]  # eager kernels: still matches eager
    assert row["fallbacks"] == row["graphs"] >= 1  # but no graph ran kiln's code
    assert (
        "code generation: NotImplementedError: refused for this test"
        in (row["fallback_reasons"][0])
    )
    assert report.format_row(row).split()[4] == report.FELL_BACK  # not a plain "yes"


def test_kiln_row_whose_aot_autograd_refuses_counts_the_fallback(
    models, kiln_logging_restored, monkeypatch
):
    import kiln.autograd

    def refuse(*args, **kwargs):
        raise NotImplementedError("not for AOT autograd, for this test")

    monkeypatch.setattr(kiln.autograd, "aot_compile", refuse)
    task = _task("mlp", "kiln", train=True)
    (row,) = measure.run_task(task, models["mlp"], measure.compile_kiln)
    assert row["correct"] is True, row["error"]  # outputs and gradients against eager's
    assert row["fallbacks"] == row["graphs"] >= 1
    assert "AOT autograd: NotImplementedError" in row["fallback_reasons"][0]


def test_rows_of_kiln_that_compiled_everything_have_no_fallbacks(models, kiln_logging_restored):
    (row,) = measure.run_task(_task("mlp", "kiln"), models["mlp"], measure.compile_kiln)
    assert row["correct"] is True, row["error"]
    assert row["fallbacks"] == 0 and row["fallback_reasons"] == []
    assert report.format_row(row).split()[4] == "yes"


def _mlp(x, w1, w2):
    return torch.relu(x @ w1).mul(2.0).tanh() @ w2 + x


def _mlp_inputs():
    return torch.randn(64, 256), torch.randn(256, 512), torch.randn(512, 256)


def test_arena_blocks_are_counted_while_a_compiled_graph_keeps_them():
    import kiln
    from kiln.runtime import arenas as arena

    gc.collect()
    before = arena.held_bytes()
    kiln.reset()
    compiled = kiln.compile(_mlp)
    for _ in range(3):  # the first call is the trace; the second keeps the block, the third
        # takes it back
        args = _mlp_inputs()
        torch.testing.assert_close(compiled(*args), _mlp(*args))
    held = arena.held_bytes() - before
    # at least one intermediate lives there (the relu/tanh kernel is stored over x @ w1's
    # buffer, schedule/inplace.py; which of the two the arena keeps is its peak rule's choice)
    assert held >= 64 * 256 * 4
    del compiled
    kiln.reset()
    gc.collect()
    assert arena.held_bytes() == before  # freed with the compiled graph


def test_cpu_peak_memory_counts_the_arena_kept_between_calls(monkeypatch):
    """The block is allocated on the first call and kept: the profiler's events of a later
    call do not contain it, so without `held_bytes` the peak would miss it entirely."""
    import kiln
    from kiln.runtime import arenas as arena

    class Mlp(torch.nn.Module):
        def forward(self, x, w1, w2):
            return _mlp(x, w1, w2)

    kiln.reset()
    module = kiln.compile(Mlp())
    for _ in range(2):  # the first call is the trace, run eagerly; the second keeps the block
        args = _mlp_inputs()
        torch.testing.assert_close(module(*args), _mlp(*args))
    step = measure.Step(module, module, train=False, grads={})
    for _ in range(2):  # the step runs under no_grad: its own graph, traced then kept
        step(args)
    gc.collect()
    held = arena.held_bytes()
    counted = measure.peak_memory(step, args, "cpu")
    monkeypatch.setattr(arena, "held_bytes", lambda: 0)
    missed = measure.peak_memory(step, args, "cpu")
    assert held > 0
    assert abs(counted - missed - held) < 1024  # two calls' small allocations differ by bytes
    intermediate = 64 * 512 * 4
    assert counted >= sum(a.numel() * 4 for a in args) + intermediate


# DESIGN.md §3's memory rule as `kiln bench` measures it: with the slack spent everywhere, the
# arena put the deep MLP's peak 0.12 MiB and nanoGPT's 0.5 MiB above eager's (2026-11-21).
@pytest.mark.parametrize("model", ["mlp", "nanogpt"])
def test_kiln_peak_with_its_arenas_is_at_most_eagers(
    models, kiln_logging_restored, monkeypatch, model
):
    from kiln.runtime import arenas as arena

    held = []
    real_peak = measure.peak_memory

    def peak_and_arenas(step, inputs, device, other=None):
        held.append(arena.held_bytes())
        return real_peak(step, inputs, device, other)

    monkeypatch.setattr(measure, "peak_memory", peak_and_arenas)
    task = _task(model, "kiln", with_eager=True, size="small")
    eager, row = measure.run_task(task, models[model], measure.compile_kiln)
    assert row["correct"] is True, row["error"]
    assert row["fallbacks"] == 0
    # (whether a model keeps an arena depends on its plan: nanoGPT's went when its qkv split
    # became views; that the peak counts a held arena is the test above)
    assert row["peak_mem_bytes"] <= eager["peak_mem_bytes"], f"arena held: {held[-1]} bytes"
