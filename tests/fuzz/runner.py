"""Run a generated program compiled and eagerly, call by call, and report every difference.

Takes a seed (the program, generator.py) and a backend; gives the list of mismatches (empty if
kiln agreed with eager everywhere). The program's module is executed twice, into two separate
namespaces, so the compiled and the eager run each have their own outside state. Before call
`i` both copies run `mutate(i)` (the same changes to globals, closure containers, attributes),
both RNGs (torch's and Python's) are seeded alike, and both get equal fresh inputs. After the
call the outcome (result, or exception type and message), the inputs (mutated in place or
not), `state()` (all outside state) and, for a program whose inputs require grad, the gradients
of its outputs with respect to them must agree: exactly for ints, strings and structures,
within float tolerances for float math.
"""

from __future__ import annotations

import linecache
import math
import random
import traceback
import warnings
from dataclasses import dataclass

import torch

import kiln

from .generator import FEAT, generate

# float tolerances: the eager backend runs the very kernels eager does (exact but for the order
# of a few reductions); kiln's code generator fuses and reorders float math
TOLERANCES = {"eager": (1e-5, 1e-6), "aot_eager": (1e-5, 1e-6)}
DEFAULT_TOLERANCE = (2e-3, 1e-4)


@dataclass
class Mismatch:
    seed: int
    backend: str
    call: int
    what: str
    source: str

    def describe(self) -> str:
        return (
            f"seed {self.seed} (backend={self.backend!r}), call {self.call}: {self.what}\n"
            f"{self.source}"
        )


def load(source: str, tag: str) -> dict:
    """Execute the program's module into a fresh namespace (its source registered with
    linecache, so tracebacks and kiln's messages can show its lines)."""
    filename = f"<kiln-fuzz-{tag}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns: dict = {"__name__": f"kiln_fuzz_{tag.replace('-', '_')}"}
    exec(compile(source, filename, "exec"), ns)
    return ns


def make_inputs(seed: int, call: int, batch: int, n: int, grad: bool = False, stable=False):
    """The call's arguments, and the leaf tensors gradients are taken for (when `grad`: x and
    y are then computed from leaves that require grad, so the program's in-place statements on
    them stay legal, as in eager). `stable`: `lst` is the first call's on every call."""
    g = torch.Generator().manual_seed(seed * 131 + call)
    x = torch.randn(batch, FEAT, generator=g)
    y = torch.randn(batch, FEAT, generator=g)
    first = 0 if stable else call
    g_lst = torch.Generator().manual_seed(seed * 131 + first + 7)
    lst = [float(v) for v in torch.rand(first % 3 + 1, generator=g_lst).round(decimals=2).tolist()]
    leaves: tuple = ()
    if grad:
        leaves = (x.requires_grad_(), y.requires_grad_())
        x, y = x * 1.0, y * 1.0
    return (x, y, n, lst), leaves


def gradients(out, leaves: tuple):
    """d(a weighted sum of the outputs that require grad)/d(leaves), or what backward raised;
    None when no output requires grad."""
    flat = out if isinstance(out, (tuple, list)) else (out,)
    outs = [o for o in flat if isinstance(o, torch.Tensor) and o.requires_grad]
    if not leaves or not outs:
        return None
    loss = sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs))
    try:
        return list(torch.autograd.grad(loss, leaves, allow_unused=True))
    except Exception as e:  # noqa: BLE001 - eager's backward must fail the same way
        return f"backward raised {type(e).__name__}: {e}"


_IN_PLACE_REFUSAL = "modified by an inplace operation"


def _run_call(fn, args, rng_seed: int):
    torch.manual_seed(rng_seed)
    random.seed(rng_seed)
    try:
        return ("ok", fn(*args))
    except Exception as e:  # the program may raise; compiled must raise the same
        return ("raise", e)


def _raised_at(exc: BaseException) -> tuple:
    """The program's innermost frame in the traceback (function, line); the two copies of the
    module differ only in their file names."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "<kiln-fuzz-" in f.filename]
    return (frames[-1].name, frames[-1].lineno) if frames else None


def differences(got, expected, rtol: float, atol: float, path: str = "") -> list[str]:
    """Where `got` differs from `expected` (empty if they agree)."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return [f"{path}: expected a tensor, got {type(got).__name__} {got!r:.80}"]
        for attr in ("shape", "dtype", "requires_grad"):
            if getattr(got, attr) != getattr(expected, attr):
                return [f"{path}: {attr} {getattr(got, attr)} != {getattr(expected, attr)}"]
        try:
            torch.testing.assert_close(
                got.detach(), expected.detach(), rtol=rtol, atol=atol, equal_nan=True
            )
        except AssertionError as e:
            return [f"{path}: {str(e).strip()[:400]}"]
        return []
    if type(got) is not type(expected):
        return [f"{path}: type {type(got).__name__} != {type(expected).__name__} ({got!r:.60})"]
    if isinstance(expected, (list, tuple)):
        if len(got) != len(expected):
            return [f"{path}: length {len(got)} != {len(expected)}"]
        out = []
        for i, (g, e) in enumerate(zip(got, expected)):
            out += differences(g, e, rtol, atol, f"{path}[{i}]")
        return out
    if isinstance(expected, dict):
        if list(got) != list(expected):
            return [f"{path}: keys {list(got)} != {list(expected)}"]
        out = []
        for k in expected:
            out += differences(got[k], expected[k], rtol, atol, f"{path}[{k!r}]")
        return out
    if isinstance(expected, float):
        if math.isnan(expected) and math.isnan(got):
            return []
        if not math.isclose(got, expected, rel_tol=rtol, abs_tol=atol):
            return [f"{path}: {got!r} != {expected!r}"]
        return []
    if got != expected:
        return [f"{path}: {got!r} != {expected!r}"]
    return []


def run_program(seed: int, backend: str = "eager", options: dict | None = None) -> list[Mismatch]:
    """Run program `seed` compiled with `backend` and eagerly; the mismatches found."""
    source = generate(seed)
    rtol, atol = TOLERANCES.get(backend, DEFAULT_TOLERANCE)
    eager_ns = load(source, f"{seed}-eager")
    comp_ns = load(source, f"{seed}")
    opts = dict(options or {})
    if comp_ns["USES_RNG"] and backend not in TOLERANCES:
        opts.setdefault("fallback_random", True)  # generated kernels draw other numbers
    compiled = kiln.compile(comp_ns["fn"], backend=backend, options=opts or None)
    found: list[Mismatch] = []

    def mismatch(call: int, what: str) -> None:
        found.append(Mismatch(seed, backend, call, what, source))

    for i, (batch, n) in enumerate(eager_ns["CALLS"]):
        eager_ns["mutate"](i)
        comp_ns["mutate"](i)
        grad, stable = bool(eager_ns["REQUIRES_GRAD"]), bool(eager_ns["STABLE_INPUTS"])
        e_args, e_leaves = make_inputs(seed, i, batch, n, grad, stable)
        c_args, c_leaves = make_inputs(seed, i, batch, n, grad, stable)
        expected = _run_call(eager_ns["fn"], e_args, seed + i)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = _run_call(compiled, c_args, seed + i)
        if expected[0] == "raise" or got[0] == "raise":
            if expected[0] != got[0]:
                exc = got[1] if got[0] == "raise" else expected[1]
                tb = "".join(traceback.format_exception(exc))[-3000:]
                side = "compiled" if got[0] == "raise" else "eager"
                mismatch(i, f"only {side} raised {type(exc).__name__}: {exc}\n{tb}")
                break
            e_exc, c_exc = expected[1], got[1]
            if type(e_exc) is not type(c_exc) or str(e_exc) != str(c_exc):
                mismatch(i, f"raised {type(c_exc).__name__}({c_exc}) != {e_exc!r}")
                break
            e_where, c_where = _raised_at(e_exc), _raised_at(c_exc)
            if e_where != c_where:
                tb = "".join(traceback.format_exception(c_exc))[-3000:]
                mismatch(i, f"raised at {c_where}, eager at {e_where}\n{tb}")
                break
        else:
            for d in differences(got[1], expected[1], rtol, atol, "result"):
                mismatch(i, d)
            if not found:
                g_got, g_exp = gradients(got[1], c_leaves), gradients(expected[1], e_leaves)
                # eager refuses to differentiate through a tensor the program changed in place
                # after saving it; compiled graphs are functional and give the gradient (as
                # torch.compile's do): there is no eager gradient to compare with
                if not (isinstance(g_exp, str) and _IN_PLACE_REFUSAL in g_exp):
                    for d in differences(g_got, g_exp, rtol, atol, "input gradients"):
                        mismatch(i, d)
        for d in differences(list(c_args), list(e_args), rtol, atol, "inputs after the call"):
            mismatch(i, d)
        for d in differences(comp_ns["state"](), eager_ns["state"](), rtol, atol, "state"):
            mismatch(i, d)
        if found:
            break
    return found


def run_many(seeds, backend: str = "eager", options: dict | None = None) -> list[Mismatch]:
    out: list[Mismatch] = []
    for seed in seeds:
        out += run_program(seed, backend, options)
    return out
