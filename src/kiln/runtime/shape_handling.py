"""Shape handling (the seeds' `enable_shape_handling`): pad inputs up to a few sizes, "gears",
so that device graphs, which replay one recorded graph per input shape, serve every size with a
graph per gear.

Takes `options["shape_handling_configs"]` (a list of dicts, the seeds' fields below) and any
callable that runs the compiled program; gives a callable that, on each call, pads every
configured tensor input along its declared dimension up to the next gear with the declared
value, runs the callable once at the gear's size, and slices every tensor output whose size
along that dimension is the gear back to the call's size.

A config (torch_npu's `NPUShapeHandling` names; `parse_configs` refuses anything else):

    {"type": "BATCHSIZE" | "SEQLEN",   # required: what the dimension is
     "dimensions": 0,                  # the dimension (BATCHSIZE: 0 by default; SEQLEN: an int,
                                       #   or one per selected input)
     "indices": [0, 1],                # which tensor inputs (positions among the call's tensor
                                       #   arguments, flattened in order); default: all
     "value": 0.0,                     # the padding value
     "gears": [],                      # explicit sizes; when empty, made by the policy:
     "min_size": 1, "max_size": 1024,  #   the policy's range, both included
     "policy": "TIMES"}                #   TIMES: min_size times powers of 2, up to max_size

Padding is sound only where rows along the padded dimension are independent: the batch
dimension in inference (each output row depends on its input row only). A reduction over that
dimension (a mean loss, batch norm in training), attention across a padded sequence without a
mask, or an output whose size there is not the input's would see the padding.
docs/dynamic_shapes.md says so; tests/runtime/test_shape_handling.py checks results against
eager where it holds.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

TYPES = ("BATCHSIZE", "SEQLEN")
POLICIES = ("TIMES",)
FIELDS = ("type", "dimensions", "indices", "value", "gears", "min_size", "max_size", "policy")
MAX_GEARS = 100


@dataclass(frozen=True)
class ShapeConfig:
    """One validated config: the dimension per selected input, the inputs, the gears."""

    type: str
    dimensions: tuple[int, ...]  # one, or one per selected input (SEQLEN)
    indices: tuple[int, ...] | None  # None: every tensor input
    value: float | int | bool
    gears: tuple[int, ...]

    def dim_for(self, k: int) -> int:
        """The dimension of the k-th selected input."""
        return self.dimensions[k] if len(self.dimensions) > 1 else self.dimensions[0]

    def gear_for(self, size: int, where: str) -> int:
        i = bisect.bisect_left(self.gears, size)
        if i == len(self.gears):
            raise ValueError(
                f"kiln shape handling: {where} has size {size}, beyond the last gear "
                f"{self.gears[-1]} of the {self.type} config (gears {list(self.gears)}). "
                "Raise 'max_size' or add a larger size to 'gears'."
            )
        return self.gears[i]


def _err(i: int, text: str) -> ValueError:
    return ValueError(f"kiln.compile: options['shape_handling_configs'][{i}]: {text}")


def _int(i: int, cfg: dict, name: str, default: int, least: int) -> int:
    v = cfg.get(name, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < least:
        raise _err(i, f"{name!r} must be an int >= {least}, got {v!r}")
    return v


def times_gears(min_size: int, max_size: int) -> tuple[int, ...]:
    """Policy TIMES: min_size, 2*min_size, 4*min_size, ... up to max_size (included)."""
    gears, g = [], min_size
    while g < max_size:
        gears.append(g)
        g *= 2
    gears.append(max_size)
    return tuple(gears)


def parse_configs(configs: Any) -> tuple[ShapeConfig, ...]:
    """Validate `shape_handling_configs`; a clear error names the config, the field and the fix."""
    if not isinstance(configs, (list, tuple)) or not configs:
        raise ValueError(
            "kiln.compile: options['enable_shape_handling'] needs "
            "options['shape_handling_configs'], a non-empty list of dicts such as "
            "[{'type': 'BATCHSIZE', 'dimensions': 0, 'min_size': 1, 'max_size': 64}]"
        )
    out = []
    for i, cfg in enumerate(configs):
        if not isinstance(cfg, dict):
            raise _err(i, f"expected a dict, got {type(cfg).__name__}")
        unknown = sorted(set(cfg) - set(FIELDS))
        if unknown:
            raise _err(i, f"unknown field(s) {unknown}; known fields: {', '.join(FIELDS)}")
        kind = cfg.get("type")
        if kind not in TYPES:
            raise _err(i, f"'type' must be one of {TYPES}, got {kind!r}")
        policy = cfg.get("policy", "TIMES")
        if policy not in POLICIES:
            raise _err(i, f"unknown 'policy' {policy!r}; known policies: {', '.join(POLICIES)}")
        dims = cfg.get("dimensions", 0 if kind == "BATCHSIZE" else None)
        if dims is None:
            raise _err(i, "a SEQLEN config needs 'dimensions' (the sequence dimension)")
        dims_t = (dims,) if isinstance(dims, int) else tuple(dims)
        if not dims_t or any(not isinstance(d, int) or isinstance(d, bool) for d in dims_t):
            raise _err(i, f"'dimensions' must be an int or a list of ints, got {dims!r}")
        if any(d < 0 for d in dims_t):
            raise _err(i, f"'dimensions' must be >= 0 (counted from the front), got {dims!r}")
        if kind == "BATCHSIZE":
            dims_t = dims_t[:1]  # every input shares the batch dimension (the seeds' rule)
        indices = cfg.get("indices")
        if indices is not None:
            if not isinstance(indices, (list, tuple)) or not all(
                isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in indices
            ):
                raise _err(i, f"'indices' must be a list of input positions >= 0, got {indices!r}")
            if len(dims_t) > 1 and len(dims_t) != len(indices):
                raise _err(
                    i,
                    f"{len(dims_t)} 'dimensions' for {len(indices)} 'indices'; give one "
                    "dimension for all inputs or one per input",
                )
            indices = tuple(indices)
        value = cfg.get("value", 0.0)
        if not isinstance(value, (int, float, bool)):
            raise _err(i, f"'value' (the padding value) must be a number, got {value!r}")
        gears = cfg.get("gears") or ()
        if gears:
            if not isinstance(gears, (list, tuple)) or not all(
                isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in gears
            ):
                raise _err(i, f"'gears' must be a list of sizes >= 1, got {gears!r}")
            gears = tuple(sorted(set(gears)))
        else:
            lo = _int(i, cfg, "min_size", 1, 1)
            hi = _int(i, cfg, "max_size", 1024, 1)
            if hi < lo:
                raise _err(i, f"'max_size' ({hi}) is smaller than 'min_size' ({lo})")
            gears = times_gears(lo, hi)
        if len(gears) > MAX_GEARS:
            raise _err(i, f"{len(gears)} gears; at most {MAX_GEARS} (each may record a graph)")
        out.append(ShapeConfig(kind, dims_t, indices, value, gears))
    return tuple(out)


class ShapeHandled:
    """`fn` called at gear sizes: pads inputs, runs `fn`, slices outputs back.

    `gear_calls` counts the calls per (config, gear): what a device-graph runner inside would
    record one graph for. Attributes it does not have are `fn`'s (a compiled function's
    counters stay readable through it)."""

    def __init__(self, fn: Callable, configs: tuple[ShapeConfig, ...]) -> None:
        self.fn = fn
        self.configs = configs
        self.gear_calls: Counter = Counter()

    def __getattr__(self, name: str):
        return getattr(self.__dict__["fn"], name)

    def __call__(self, *args, **kwargs):
        flat, spec = tree_flatten((args, kwargs))
        tensor_at = [k for k, v in enumerate(flat) if isinstance(v, torch.Tensor)]
        restore: list[tuple[int, int, int]] = []  # (dim, gear, size), per config
        for c, cfg in enumerate(self.configs):
            chosen = cfg.indices if cfg.indices is not None else range(len(tensor_at))
            size = gear = None
            for k, idx in enumerate(chosen):
                if idx >= len(tensor_at):
                    raise IndexError(
                        f"kiln shape handling: config {c} selects tensor input {idx}, but the "
                        f"call has {len(tensor_at)} tensor input(s); fix 'indices'"
                    )
                t, d = flat[tensor_at[idx]], cfg.dim_for(k)
                where = f"tensor input {idx} (shape {list(t.shape)})"
                if d >= t.dim():
                    raise IndexError(
                        f"kiln shape handling: config {c} pads dimension {d}, but {where} has "
                        f"{t.dim()} dimension(s); fix 'dimensions'"
                    )
                if cfg.type == "BATCHSIZE" and size is not None and t.size(d) != size:
                    raise ValueError(
                        f"kiln shape handling: BATCHSIZE config {c}: {where} has batch size "
                        f"{t.size(d)}, another selected input {size}; select inputs that share "
                        "the batch dimension with 'indices'"
                    )
                size = t.size(d)
                gear = cfg.gear_for(size, where)
                if gear != size:
                    pad = list(t.shape)
                    pad[d] = gear - size
                    flat[tensor_at[idx]] = torch.cat([t, t.new_full(pad, cfg.value)], dim=d)
            if size is not None and gear is not None:
                self.gear_calls[(c, gear)] += 1
                restore.append((cfg.dim_for(0), gear, size))
        args, kwargs = tree_unflatten(flat, spec)
        out = self.fn(*args, **kwargs)
        if not any(gear != size for _, gear, size in restore):
            return out
        out_flat, out_spec = tree_flatten(out)
        for dim, gear, size in reversed(restore):
            for k, o in enumerate(out_flat):
                if isinstance(o, torch.Tensor) and o.dim() > dim and o.size(dim) == gear:
                    out_flat[k] = o.narrow(dim, 0, size)
        return tree_unflatten(out_flat, out_spec)
