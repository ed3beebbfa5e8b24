"""Guards: the facts a trace relied on, and the one Python function that checks them all.

Takes (source, fact) pairs recorded while tracing; gives a boolean Python expression per guard,
joined into the check at the head of each cache entry's generated entry function (see
residual.py), plus `explain_failure`, which names the first guard that no longer holds and
the value that broke it (what `KILN_LOGS=recompiles` prints).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import torch
from torch._prims_common import make_contiguous_strides_for

from .guard_tables import table_lines
from .sources import Namer, Source

# Values guarded by equality: immutable, cheap to compare, printable.
CONSTANT_TYPES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    type(Ellipsis),
    type(NotImplemented),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    torch.Size,
    range,
    slice,
)


class Guard:
    """One fact: `check` is a format string over `{s}` (the source expression) and named
    held objects; `text` is what a person reads (a string, or a function that writes it, for
    facts whose text costs more to write than the trace ever needs: a large model has hundreds
    of tensor guards and their text is read only when one fails or guards are logged).

    Not changed after it is made. A plain class, not a frozen dataclass: a trace makes several
    hundred, and a frozen dataclass's __init__ costs three times as much."""

    __slots__ = ("source", "kind", "check", "held", "_text", "other", "native")

    def __init__(
        self,
        source: Source | None,
        kind: str,
        check: str,
        held: dict[str, Any] | None = None,
        text: str | Callable[[], str] = "",
        other: Source | None = None,  # a second source, `{o}` in the check
        native: tuple[str, tuple] | None = None,  # its native table kind (guard_tables.py)
    ) -> None:
        self.source = source
        self.kind = kind
        self.check = check
        self.held = {} if held is None else held
        self._text = text
        self.other = other
        self.native = native

    @property
    def text(self) -> str:
        return self._text if isinstance(self._text, str) else self._text()

    def expr(self, namer: Namer) -> str:
        names = {k: _literal(v) or namer.const(v) for k, v in self.held.items()}
        s = self.source.expr(namer) if self.source is not None else ""
        o = self.other.expr(namer) if self.other is not None else ""
        return self.check.format(s=s, o=o, **names)

    def bound_expr(self, namer: Namer, bound: dict[str, str]) -> str:
        """`expr`, reading each value once: a source an earlier check of the same chain bound
        to a local (a prefix of this source included) is read from that local, and this
        guard's source, when its check reads it several times (a tensor: type, dtype, device,
        sizes, strides, requires_grad), is bound on its first read (`(___seenN := ...)`) for the
        checks after it and for the graph's inputs (`Namer.bound`)."""
        if self.source is None or self.other is not None:
            return self.expr(namer)
        full = self.source.expr(namer)
        s = _reuse_bound(full, bound)
        if self.kind == "TENSOR" and self.native is not None:
            # one call checks the tensor (its C++ twin once the native module loads): an
            # optimizer's step reads ~600 tensors through lists and dicts on every call, ~1 us
            # each as the chain of attribute reads below
            if not s.isidentifier():
                var = bound[full] = f"___seen{len(bound)}"
                s = f"({var} := {s})"
            return f"{namer.const(_tensor_spec(self.held), 'ts')}.check({s})"
        names = {k: _literal(v) or namer.const(v) for k, v in self.held.items()}
        if (
            self.check.count("{s}") < 2
            or not self.check.startswith(_BINDABLE)
            or s.isidentifier()  # a local already: nothing to save
        ):
            return self.check.format(s=s, **names)
        var = bound[full] = f"___seen{len(bound)}"
        head, _, rest = self.check.partition("{s}")
        return (head + f"({var} := {s})" + rest.replace("{s}", var)).format(**names)

    def row(self) -> tuple | None:
        """This guard's values as a row of a table checked in a loop (see
        GuardSet.check_lines), when its source is a held object; None otherwise."""
        held_row = self.source.row() if self.source is not None and self.other is None else None
        if held_row is None:
            return None
        return held_row[0] + tuple(self.held.values())

    def table(self) -> tuple[str, str]:
        """The loop variables of this guard's table and its check written over them."""
        _, names, s = self.source.row()
        names += tuple(f"___r_{k}" for k in self.held)
        return ", ".join(names), self.check.format(s=s, **{k: f"___r_{k}" for k in self.held})

    def describe(self) -> str:
        if self.source is not None:
            where = self.source.describe()
        else:  # a fact about sizes (symbolic.py, dynamic.py), or about the process's state
            where = "sizes" if self.kind in ("SYM", "SHAPE") else "global state"
        return f"{where}: {self.text or self.kind}"

    def key(self) -> tuple:
        src = self.source.describe() if self.source is not None else ""
        other = self.other.describe() if self.other is not None else ""
        # held values are kept alive by the guard that holds them, so their ids are unique
        return (self.kind, src, other, self.check, tuple(map(id, self.held.values())))


def type_guard(source: Source, value: Any) -> Guard:
    t = type(value)
    return Guard(source, "TYPE", "type({s}) is {t}", {"t": t}, f"type is {t.__qualname__}")


def id_guard(source: Source, value: Any) -> Guard:
    return Guard(source, "ID", "{s} is {v}", {"v": value}, f"is the same object ({_short(value)})")


def same_guard(source: Source, other: Source) -> Guard:
    return Guard(source, "SAME", "{s} is {o}", {}, f"is the same object as {other}", other)


def constant_guard(source: Source, value: Any) -> Guard:
    if isinstance(value, float) and math.isnan(value):
        return Guard(source, "CONST", "type({s}) is float and {s} != {s}", {}, "== nan")
    native = None
    identity = value is None or isinstance(value, (bool, torch.dtype))
    if source.row() is not None:  # one form for every value, so that they share a table
        check, native, identity = "type({s}) is {t} and {s} == {v}", ("items", ()), False
    elif identity:
        check = "{s} is {v}"
    elif type(value) in (int, str, float) and len(repr(value)) < 80:
        check = "type({s}) is " + type(value).__name__ + " and {s} == {v}"
    else:
        check = "type({s}) is {t} and {s} == {v}"
    held = {"t": type(value), "v": value}
    text = f"{'is' if identity else '=='} {value!r:.60}"
    return Guard(source, "CONST", check, held, text, native=native)


def members_guard(source: Source, value: set | frozenset) -> Guard:
    """A set's type and members, against a frozen copy: a set mutated between calls (`s.add`)
    is not the copy held here (holding the set itself would compare it with itself)."""
    members = frozenset(value)
    return Guard(
        source,
        "MEMBERS",
        "type({s}) is {t} and {s} == {v}",
        {"t": type(value), "v": members},
        f"is a {type(value).__name__} of {sorted(map(repr, members))!r:.80}",
    )


def len_guard(source: Source, value: Any) -> Guard:
    n = len(value)
    return Guard(
        source,
        "LEN",
        "type({s}) is {t} and len({s}) == " + str(n),
        {"t": type(value)},
        f"is a {type(value).__name__} of length {n}",
    )


def keys_guard(source: Source, value: dict) -> Guard:
    keys = tuple(value.keys())
    return Guard(
        source,
        "KEYS",
        "type({s}) is {t} and tuple({s}) == {k}",
        {"t": type(value), "k": keys},
        f"is a {type(value).__name__} with keys {list(keys)!r:.80}",
    )


_TENSOR_CHECK = (
    "type({s}) is {t} and {s}.dtype is {d} and {s}.is_cpu and {s}.shape == {sh} and "
    "{s}.stride() == {st} and {s}.requires_grad is {rg}"
)


def tensor_guard(source: Source, t: torch.Tensor) -> Guard:
    """Type, dtype, device, sizes, strides and requires_grad of a tensor, as a chain of the
    cheapest reads that decide each: identity for the type, dtype and flag, `is_cpu` rather than
    building a `torch.device` to compare, sizes and strides against tuples. (Large models check
    hundreds of parameters per call; this is a fifth cheaper than building one tuple of them and
    comparing it.)"""
    shape, stride, dtype, rg = tuple(t.shape), tuple(t.stride()), t.dtype, t.requires_grad
    held = {"t": type(t), "d": dtype, "sh": shape, "st": stride, "rg": rg}
    if t.is_cpu:
        check = _TENSOR_CHECK
    else:
        device = held["dev"] = t.device
        check = _TENSOR_CHECK.replace("{s}.is_cpu", _device_check(device))

    def text() -> str:
        device = held.get("dev", "cpu")
        return (
            f"{held['t'].__name__}(dtype={dtype}, device={device}, shape={list(shape)}, "
            f"stride={list(stride)}, requires_grad={rg})"
        )

    native = ("tensors", ()) if type(t) in (torch.Tensor, torch.nn.Parameter) else None
    return Guard(source, "TENSOR", check, held, text, native=native)


def _tensor_spec(held: dict):
    """The native table (`kiln.native.tensor_spec`) checking a tensor guard's facts, with the
    same answers as its chain of attribute reads."""
    from .. import native  # here: importing it starts nothing

    t, d, sh, st, rg = held["t"], held["d"], held["sh"], held["st"], held["rg"]
    dev = held.get("dev", _CPU)

    def python_check(x: Any) -> bool:
        return (
            type(x) is t
            and x.dtype is d
            and x.device == dev
            and x.shape == sh
            and x.stride() == st
            and x.requires_grad is rg
        )

    return native.tensor_spec((t, d, dev, sh, st, rg), python_check)


_CPU = torch.device("cpu")
_IS_INFERENCE = torch._C.TensorBase.is_inference  # the unbound method: no attribute lookup


def inference_guard(source: Source, t: torch.Tensor) -> Guard:
    """Whether a tensor input is an inference tensor (made under torch.inference_mode). Added
    when a trace reads `is_inference()` (see Tracer.note_inference_read): eager's other
    differences for such tensors (refused in-place updates, refused saving for backward) are
    errors the compiled graph raises too, and a check on every input of every call would cost
    a fifth of a microsecond each."""
    value = bool(_IS_INFERENCE(t))
    check = "{inf}({s})" if value else "not {inf}({s})"
    text = "is an inference tensor" if value else "is not an inference tensor"
    return Guard(source, "INFERENCE", check, {"inf": _IS_INFERENCE}, text)


def offset_guard(source: Source, t: torch.Tensor) -> Guard:
    """A tensor input's storage offset, by value. Added when a trace reads `storage_offset()`
    (see Tracer.note_offset_read): the tensor guard checks sizes and strides but not where a
    view starts in its storage, so a branch or a size computed from the offset would be kept
    for inputs that start elsewhere (a wrong result). Rare in real code, so only traces that
    read an offset pay for the check."""
    value = int(t.storage_offset())
    return Guard(
        source, "OFFSET", f"{{s}}.storage_offset() == {value}", {}, f"storage offset {value}"
    )


def _device_check(device: torch.device) -> str:
    """`is_cpu`, or for a CUDA tensor an int compare of `get_device()` (reading `.device`
    builds a `torch.device` each time: a ResNet-50 checks 268 tensors a call)."""
    if device.type == "cpu":
        return "{s}.is_cpu"
    if device.type == "cuda" and device.index is not None:
        if device.index == 0 and torch.cuda.device_count() == 1:
            return "{s}.is_cuda"  # the process sees one CUDA device: is_cuda says which
        return f"({{s}}.is_cuda and {{s}}.get_device() == {device.index})"
    return "{s}.device == {dev}"


def standard_contiguous(t: torch.Tensor) -> bool:
    """Whether `t` has exactly the strides a fresh contiguous tensor of its sizes has (not
    only `is_contiguous()`, which lets a dimension of size 1 have any stride)."""
    return t.stride() == make_contiguous_strides_for(t.shape)


def dynamic_tensor_guard(source: Source, t: torch.Tensor, dims: set[int]) -> Guard:
    """Like tensor_guard, but dimensions in `dims` may take any size (their facts are the
    shape environment's guards); strides are checked as a layout, not as numbers."""
    n = t.dim()
    static = " and ".join(f"{{s}}.size({d}) == {t.size(d)}" for d in range(n) if d not in dims)
    layout = (
        "{s}.is_contiguous()" if t.is_contiguous() else f"{{s}}.stride() == {tuple(t.stride())!r}"
    )
    check = (
        "type({s}) is {t} and {s}.dtype is {d} and "
        + _device_check(t.device)
        + f" and {{s}}.dim() == {n} and {layout} and {{s}}.requires_grad is {t.requires_grad!r}"
        + (f" and {static}" if static else "")
    )
    held = {"t": type(t), "d": t.dtype, "dev": t.device}
    shape = [("*" if d in dims else t.size(d)) for d in range(n)]
    text = (
        f"{type(t).__name__}(dtype={t.dtype}, device={t.device}, shape={shape} "
        f"(* = dynamic), requires_grad={t.requires_grad})"
    )
    return Guard(source, "TENSOR", check, held, text)


def dict_guard(source: Source, d: dict) -> Guard:
    """`source` (a held object whose attributes are read from its `__dict__`) keeps `d`."""
    text = "keeps its instance dictionary"
    return Guard(source, "DICT", "{s}.__dict__ is {d}", {"d": d}, text, native=("dicts", ()))


def no_hooks_guard(source: Source, names: tuple[str, ...], d: dict | None) -> Guard:
    """A module's hook dictionaries `names` are all empty (read from its instance dictionary
    `d` when the module is held)."""
    if d is None:
        reads, held = [f"{{s}}.{h}" for h in names], {}
    else:
        reads, held = [f"{{d}}[{h!r}]" for h in names], {"d": d}
    check = f"not ({' or '.join(reads)})"
    native = ("empty", names) if d is not None else None
    return Guard(source, "HOOKS", check, held, "has no hooks", native=native)


def not_in_guard(source: Source, name: str) -> Guard:
    return Guard(source, "NOT_IN", f"{name!r} not in {{s}}", {}, f"has no {name!r} (a builtin)")


def state_guard(label: str, fn: Any, value: Any) -> Guard:
    """A global fact (grad mode, autocast), read by calling `fn()`."""
    return Guard(None, "STATE", "{f}() == {v}", {"f": fn, "v": value}, f"{label} == {value!r}")


def _literal(value: Any) -> str | None:
    """Python source for a value that reads better written out than named (sizes, flags)."""
    if value is None or type(value) in (bool, int, str):
        text = repr(value)
        return text if len(text) < 80 else None
    if type(value) is float:
        return repr(value) if math.isfinite(value) else None
    if type(value) is tuple and all(type(v) is int for v in value):
        return repr(value)
    return None


def _short(value: Any) -> str:
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    return name if isinstance(name, str) else type(value).__name__


# checks whose first read of `{s}` comes first when evaluated (Python's `and` chains run left
# to right), so a walrus there binds the value before the other reads use it
_BINDABLE = ("type({s}) is ",)


def _reuse_bound(expr: str, bound: dict[str, str]) -> str:
    """`expr` with its longest prefix that names a bound value read from that local (a
    prefix ends where an attribute or an index begins)."""
    if expr in bound:
        return bound[expr]
    for end in range(len(expr) - 1, 0, -1):
        if expr[end] in ".[" and expr[:end] in bound:
            return bound[expr[:end]] + expr[end:]
    return expr


def _reuse_bound_reads(fact: str, bound: dict[str, str]) -> str:
    """A size fact reading its inputs from the locals the guard chain bound them to: an input
    fetched by a call (`torch.from_numpy` of an array argument) is fetched once a call."""
    for full, var in bound.items():
        if full + "." in fact:
            fact = fact.replace(full + ".", var + ".")
    return fact


class GuardSet:
    """Guards of one trace, deduplicated, in the order they were first relied on."""

    def __init__(self) -> None:
        self.guards: list[Guard] = []
        self._keys: set[tuple] = set()

    def add(self, guard: Guard) -> None:
        k = guard.key()
        if k not in self._keys:
            self._keys.add(k)
            self.guards.append(guard)

    def check_lines(self, namer: Namer) -> list[str]:
        """The entry function's checks: `return ___MISS` unless every guard holds. Guards of
        held objects (parameters, buffers and modules, fixed under the module-structure guard)
        that share a check are rows of one table, checked in a loop after the others: as fast
        to run as one inline check each, and a large model's entry compiles in a fraction of
        the time (GPT-2's ~500 held facts took 5 ms of its capture to compile inline)."""
        inline: list[Guard] = []
        sizes: list[str] = []
        tables: dict[tuple, tuple[Guard, list]] = {}
        for g in self.guards:
            if g.source is None and g.kind in ("SHAPE", "SYM"):
                sizes.append(g)
                continue
            row = g.row()
            if row is None:
                inline.append(g)
                continue
            shape = (type(g.source), g.check, tuple(g.held))  # guards that share one check
            tables.setdefault(shape, (g, []))[1].append(row)
        lines = []
        for first, rows in tables.values():
            if len(rows) == 1:
                inline.append(first)
                continue
            lines += table_lines(first, rows, namer)
        # One `and` chain: every check in it has run when the entry goes on, so each value it
        # bound is there for the checks after it and for the graph's inputs. An optimizer's
        # step reads each state tensor through `self.state[p]['exp_avg']` (a dict lookup
        # hashing a parameter in Python): read once instead of seven times per call.
        exprs = [g.bound_expr(namer, namer.bound) for g in inline]
        cond = " and\n        ".join(f"({e})" for e in exprs) or "True"
        facts = [_reuse_bound_reads(g.expr(namer), namer.bound) for g in sizes]
        return [f"if not ({cond}):", "    return ___MISS", *lines, *_size_fact_lines(facts)]

    def describe(self) -> str:
        return "\n".join(f"  {g.describe()}" for g in self.guards)


def _size_fact_lines(facts: list[str]) -> list[str]:
    """The facts about sizes, checked last (after the guards that say each tensor read has the
    dimensions read), with each size read more than once read once into a local: a dynamic
    entry's facts read the same few sizes again and again, and each `.size(d)` is a call."""
    if not facts:
        return []
    reads: dict[str, int] = {}
    for f in facts:
        for r in _SIZE_READ.findall(f):
            reads[r] = reads.get(r, 0) + 1
    local = {r: f"___z{i}" for i, r in enumerate(r for r, n in reads.items() if n > 1)}
    if local:
        facts = [_SIZE_READ.sub(lambda m: local.get(m.group(1), m.group(1)), f) for f in facts]
    cond = " and\n        ".join(f"({f})" for f in facts)
    binds = [f"{name} = {read}" for read, name in local.items()]
    return binds + [f"if not ({cond}):", "    return ___MISS"]


def explain_failure(
    guards: list[Guard], namer: Namer, params: str, args, kwargs, defaults=(), kwdefaults=None
) -> str | None:
    """Evaluate guards one by one on a call's arguments; describe the first that fails, naming
    what changed: a tensor's dimension with its old and new size, or for a fact about sizes
    (`x.size(1) == 200`, a shape-environment fact) the sizes it reads, now."""
    for g in guards:
        code = g.expr(namer)
        sizes = sorted(set(_SIZE_READ.findall(code))) if g.source is None else []
        src = f"def ___probe({params}):\n    return ({code}), "
        value_expr = g.source.expr(namer) if g.source is not None else "None"
        src += f"{value_expr}, ({''.join(e + ', ' for e in sizes)})\n"
        scope = dict(namer.namespace)
        try:
            exec(src, scope)
            probe = scope["___probe"]
            probe.__defaults__ = tuple(defaults) or None
            probe.__kwdefaults__ = dict(kwdefaults) if kwdefaults else None
            ok, value, size_values = probe(*args, **kwargs)
        except Exception as e:  # a missing attribute or index is itself the failure
            return f"{g.describe()} -- evaluating it raised {type(e).__name__}: {e}"
        if not ok:
            if sizes:
                now = ", ".join(f"{e} is {v}" for e, v in zip(sizes, size_values))
                return f"{g.describe()} -- now {now}"
            changed = _tensor_change(g, value)
            if changed:
                return f"{g.source.describe()}: {changed}"  # type: ignore[union-attr]
            return f"{g.describe()} -- now {_show(value)}"
    return None


# a size read in guard code: `x.size(1)`, `kwargs['input_ids'].size(0)`, `self.w.size(2)`
_SIZE_READ = re.compile(r"((?:[A-Za-z_]\w*)(?:\.[A-Za-z_]\w*|\[[^\]]+\])*\.size\(\d+\))")
_STATIC_SIZE = re.compile(r"\{s\}\.size\((\d+)\) == (\d+)")


def _tensor_change(g: Guard, value: Any) -> str:
    """The dimension(s) whose size changed between a failed tensor guard and the tensor now,
    with the old and new size; "" when no size changed or the value is no tensor."""
    if g.kind != "TENSOR" or not isinstance(value, torch.Tensor):
        return ""
    if "sh" in g.held:
        old = dict(enumerate(g.held["sh"]))
        if len(old) != value.dim():
            return f"has {value.dim()} dimensions, was traced with {len(old)} ({g.text})"
    else:  # a dynamic tensor guard: its static dimensions are written into the check
        old = {int(d): int(n) for d, n in _STATIC_SIZE.findall(g.check)}
    shape = list(value.shape)
    dims = [d for d, n in old.items() if d < value.dim() and shape[d] != n]
    if dims:
        what = ", ".join(f"size of dim {d} changed from {old[d]} to {shape[d]}" for d in dims)
        return f"{what} (now shape={shape}; traced with {g.text})"
    return ""  # dtype, strides or requires_grad: the whole old and new description says it


def _show(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return (
            f"{type(value).__name__}(dtype={value.dtype}, device={value.device}, "
            f"shape={list(value.shape)}, stride={list(value.stride())}, "
            f"requires_grad={value.requires_grad})"
        )
    text = repr(value)
    return text if len(text) < 120 else text[:117] + "..."
