"""Shape handling (runtime/shape_handling.py): pad inputs up to gears, run, slice outputs back.

On the CPU the layer wraps a stand-in for device graphs that records one "graph" per input
shape, as device graphs do, so the count of graphs per gear is checked without a GPU; the GPU
test (`-m gpu`) counts the real device graphs of `mode="reduce-overhead"`. Every result is
compared with eager on fresh random inputs, where padding is sound: rows along the padded
dimension independent (the batch dimension in inference), or a padding value that the
reduction ignores.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.runtime import device_graphs as dg
from kiln.runtime.shape_handling import ShapeHandled, parse_configs, times_gears

gpu = pytest.mark.gpu
BATCH = [{"type": "BATCHSIZE", "dimensions": 0, "min_size": 1, "max_size": 64}]


def _mlp(device="cpu"):
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8))
    return mlp.to(device).eval()


class PerShapeGraphs:
    """A stand-in for device graphs: one recorded "graph" per input signature (shapes)."""

    def __init__(self, fn):
        self.fn = fn
        self.recorded: set[tuple] = set()

    def __call__(self, *args):
        self.recorded.add(tuple(tuple(a.shape) for a in args))
        return self.fn(*args)


def test_times_policy_makes_powers_of_two_between_min_and_max():
    assert times_gears(1, 64) == (1, 2, 4, 8, 16, 32, 64)
    assert times_gears(3, 20) == (3, 6, 12, 20)
    (cfg,) = parse_configs([{"type": "BATCHSIZE", "gears": [48, 8, 16, 8]}])
    assert cfg.gears == (8, 16, 48)


def test_batch_sizes_1_to_64_record_one_graph_per_gear_and_match_eager():
    mlp = _mlp()
    runner = PerShapeGraphs(mlp)
    handled = ShapeHandled(runner, parse_configs(BATCH))
    with torch.no_grad():
        for b in range(1, 65):
            x = torch.randn(b, 16)
            out = handled(x)
            assert out.shape == (b, 8)
            torch.testing.assert_close(out, mlp(x))
    assert runner.recorded == {((g, 16),) for g in times_gears(1, 64)}
    assert sorted(g for _, g in handled.gear_calls) == list(times_gears(1, 64))


def test_kiln_compile_pads_to_gears_and_matches_eager():
    mlp = _mlp()
    compiled = kiln.compile(
        mlp,
        backend="eager",
        options={"enable_shape_handling": True, "shape_handling_configs": BATCH},
    )
    with torch.no_grad():
        for b in torch.randint(1, 65, (24,)).tolist() + [1, 64]:
            x = torch.randn(b, 16)
            torch.testing.assert_close(compiled(x), mlp(x))
    cf = compiled._kiln_compiled
    # kiln sees gear sizes only: a static entry for the first, a dynamic one for the rest
    # (and, under the 0/1 policy, at most one more for gear 1)
    assert cf.compiles <= 3
    assert set(g for _, g in cf.gear_calls) <= set(times_gears(1, 64))


def test_seqlen_config_pads_with_its_value_and_slices_only_what_has_the_gear_size():
    def f(x, y):
        return x.amax(dim=1), x * 2, y + 1  # -inf padding leaves the max alone

    cfg = [
        {"type": "SEQLEN", "dimensions": 1, "indices": [0], "value": float("-inf"), "gears": [8]}
    ]
    handled = ShapeHandled(f, parse_configs(cfg))
    for n in (1, 5, 8):
        x, y = torch.randn(3, n), torch.randn(3, 7)  # y: not selected, not the gear size
        got, want = handled(x, y), f(x, y)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"type": "BATCHSIZE", "min_size": 8, "max_size": 4}, "'max_size' \\(4\\) is smaller"),
        ({"type": "BATCHSIZE", "policy": "LINEAR"}, "unknown 'policy' 'LINEAR'"),
        ({"type": "BATCH"}, "'type' must be one of"),
        ({"type": "BATCHSIZE", "dimensions": -1}, "'dimensions' must be >= 0"),
        ({"type": "BATCHSIZE", "gears": [0, 4]}, "'gears' must be a list of sizes >= 1"),
        ({"type": "BATCHSIZE", "gear": [4]}, "unknown field\\(s\\) \\['gear'\\]"),
        ({"type": "SEQLEN"}, "needs 'dimensions'"),
        ({"type": "BATCHSIZE", "min_size": 0}, "'min_size' must be an int >= 1"),
        ({"type": "BATCHSIZE", "value": "zero"}, "'value' \\(the padding value\\)"),
        ({"type": "BATCHSIZE", "gears": list(range(1, 200))}, "at most 100"),
    ],
)
def test_bad_configs_are_clear_errors_at_compile_time(cfg, message):
    with pytest.raises(ValueError, match=message):
        kiln.compile(
            lambda x: x,
            options={"enable_shape_handling": True, "shape_handling_configs": [cfg]},
        )


def test_configs_and_the_switch_go_together():
    with pytest.raises(ValueError, match="needs options\\['shape_handling_configs'\\]"):
        kiln.compile(lambda x: x, options={"enable_shape_handling": True})
    with pytest.raises(ValueError, match="but not 'enable_shape_handling'"):
        kiln.compile(lambda x: x, options={"shape_handling_configs": BATCH})


def test_a_dimension_out_of_range_or_a_size_past_the_last_gear_is_a_clear_error():
    opts = {"enable_shape_handling": True}
    f = kiln.compile(
        lambda x: x * 2,
        backend="eager",
        options={**opts, "shape_handling_configs": [{"type": "SEQLEN", "dimensions": 2}]},
    )
    with pytest.raises(IndexError, match="pads dimension 2, but tensor input 0 .* 2 dimension"):
        f(torch.randn(3, 4))
    g = kiln.compile(
        lambda x: x * 2, backend="eager", options={**opts, "shape_handling_configs": BATCH}
    )
    with pytest.raises(ValueError, match="size 65, beyond the last gear 64"):
        g(torch.randn(65, 4))


@gpu
def test_reduce_overhead_records_one_device_graph_per_gear_and_matches_eager():
    mlp = _mlp("cuda")
    compiled = kiln.compile(
        mlp,
        mode="reduce-overhead",
        options={"enable_shape_handling": True, "shape_handling_configs": BATCH},
    )
    label = compiled._kiln_compiled.label
    before = dg.RECORDED[label]
    with torch.no_grad():
        for _ in range(2):  # the second pass replays: no new graph
            for b in range(1, 65):
                x = torch.randn(b, 16, device="cuda")
                torch.testing.assert_close(compiled(x).clone(), mlp(x))
    assert dg.RECORDED[label] - before <= len(times_gears(1, 64))
