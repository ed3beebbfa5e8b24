"""options.py: every accepted option does what its name says, is refused, or warns once.

The audit test greps kiln's source for a reader of every option; the others check what each
option does against eager PyTorch on fresh random data.
"""

from __future__ import annotations

import functools
import pathlib
import re

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import logs, options
from kiln.contracts import takes_capture_info

SRC = pathlib.Path(kiln.__file__).parent


class _Warnings:
    """Collects kiln's warnings (the `kiln.fallbacks` logger) and forgets earlier warn-once keys."""

    def __init__(self, monkeypatch):
        import logging

        monkeypatch.setattr(logs, "_seen_once", set())
        self.messages: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: self.messages.append(record.getMessage())
        logger = logging.getLogger("kiln.fallbacks")
        logger.addHandler(handler)
        monkeypatch.setattr(logger, "level", logging.INFO)
        monkeypatch.setattr(logger, "handlers", [*logger.handlers])
        self.messages.clear()


def test_every_option_has_a_reader_or_says_why_not():
    sources = {
        p: p.read_text() for p in SRC.rglob("*.py") if p.name != "options.py" or p.parent != SRC
    }
    not_impl = {name for name, _ in options.NOT_IMPLEMENTED}
    for name in options.KNOWN_OPTIONS:
        if name in not_impl or name in options.HONOURED_BY_CONSTRUCTION or _refused(name):
            continue
        pattern = re.compile(rf"""\.get\(\s*["']{re.escape(name)}["']|\.{re.escape(name)}\b""")
        readers = [str(p.relative_to(SRC)) for p, text in sources.items() if pattern.search(text)]
        assert readers, f"option {name!r} is accepted but nothing in kiln reads it"


def _refused(name: str) -> bool:
    """Whether setting a boolean option away from its default is refused as not implemented."""
    default = options.KNOWN_OPTIONS[name][0]
    if not isinstance(default, bool):
        return False
    try:
        options.build_options(options={name: not default})
    except NotImplementedError:
        return True
    return False


@pytest.mark.parametrize(
    "kwargs, phrase",
    [
        ({"mode": "max-autotune"}, "no kernel search"),
        ({"mode": "max-autotune-no-cudagraphs"}, "no kernel search"),
        ({"options": {"max_autotune": True}}, "no kernel search"),
        ({"options": {"epilogue_fusion": True}}, "epilogue"),
        ({"options": {"freezing": True}}, "freeze"),
    ],
)
def test_unimplemented_speed_options_warn_once_and_stay_correct(monkeypatch, kwargs, phrase):
    w = _Warnings(monkeypatch)

    def f(x, y):
        return torch.relu(x @ y) + 1

    for _ in range(2):  # a second compile with the same setting warns no more
        g = kiln.compile(f, **kwargs)
        x, y = torch.randn(5, 6), torch.randn(6, 3)
        torch.testing.assert_close(g(x, y), f(x, y))
    said = [m for m in w.messages if phrase in m]
    assert len(said) == 1, w.messages
    if "mode" in kwargs:
        assert f"mode={kwargs['mode']!r}" in said[0] and "otherwise does what" in said[0]


def test_implemented_values_say_nothing(monkeypatch):
    w = _Warnings(monkeypatch)
    kiln.compile(lambda x: x, options={"epilogue_fusion": False, "max_autotune": False})
    kiln.compile(lambda x: x, mode="reduce-overhead")
    assert w.messages == []


def test_cache_size_limit_env_is_read_once_when_compiling(monkeypatch):
    monkeypatch.setenv("KILN_CACHE_SIZE_LIMIT", "2")
    f = kiln.compile(lambda x, n: x * n, backend="eager")
    monkeypatch.setenv("KILN_CACHE_SIZE_LIMIT", "50")  # read when compiled, not on each call
    x = torch.randn(3)
    for n in range(5):
        torch.testing.assert_close(f(x, n), x * n)
    assert len(f._kiln_compiled.entries) == 2
    assert f._kiln_compiled.eager_reason == "cache size limit"
    # an explicit option wins over the environment
    g = kiln.compile(lambda x, n: x * n, backend="eager", options={"cache_size_limit": 4})
    for n in range(6):
        torch.testing.assert_close(g(x, n), x * n)
    assert len(g._kiln_compiled.entries) == 4


def test_bad_cache_size_limit_env_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("KILN_CACHE_SIZE_LIMIT", "many")
    with pytest.raises(ValueError, match="KILN_CACHE_SIZE_LIMIT='many'.*positive"):
        kiln.compile(lambda x: x)


@pytest.mark.parametrize(
    "kwargs, phrase",
    [
        ({"backend": "eager", "mode": "reduce-overhead"}, "mode='reduce-overhead' sets"),
        ({"backend": "aot_eager", "options": {"debug.fuel": 3}}, "debug.fuel=3"),
        ({"backend": "eager", "options": {"debug.verify_ir": True}}, "debug.verify_ir"),
        ({"backend": "cudagraphs", "options": {"debug.fuel": 0}}, "debug.fuel=0"),
    ],
)
def test_codegen_options_with_a_backend_that_ignores_them_are_refused(kwargs, phrase):
    with pytest.raises(ValueError, match=re.escape(phrase) + ".*backend='inductor'"):
        kiln.compile(lambda x: x, **kwargs)


def test_backends_that_read_the_options_keep_them():
    seen = []

    @takes_capture_info  # a callable may hand the graph, and the facts, to kiln's own backend
    def backend(gm, example_inputs, info):
        seen.append(info.options.get("debug.fuel"))
        return gm.forward

    f = kiln.compile(lambda x: x.sin() * 2, backend=backend, options={"debug.fuel": 2})
    x = torch.randn(4)
    torch.testing.assert_close(f(x), x.sin() * 2)
    assert seen == [2]
    kiln.compile(lambda x: x, backend="cudagraphs", mode="reduce-overhead")  # what it does


def test_trace_dir_without_trace_enabled_is_refused():
    with pytest.raises(ValueError, match="'trace.dir' but not 'trace.enabled'"):
        kiln.compile(lambda x: x, options={"trace.dir": "/tmp/nowhere"})


def test_fallback_random_draws_what_eager_draws():
    def f(x, w):
        h = F.dropout(x @ w, p=0.4, training=True)
        return h * torch.rand_like(h) + torch.bernoulli(torch.full_like(h, 0.3))

    g = kiln.compile(f, options={"fallback_random": True})
    for seed in range(3):  # the first call traces, the others run the compiled graphs
        x = torch.randn(6, 8)
        w = torch.randn(8, 5, requires_grad=True)
        wc = w.detach().clone().requires_grad_(True)
        torch.manual_seed(seed)
        want = f(x, w)
        torch.manual_seed(seed)
        got = g(x, wc)
        assert torch.equal(got == 0, want == 0)  # the same dropout mask and Bernoulli draws
        torch.testing.assert_close(got, want)
        grad = torch.randn_like(want)
        want.backward(grad)
        got.backward(grad)
        torch.testing.assert_close(wc.grad, w.grad)


def test_shape_padding_off_leaves_matmuls_as_written(monkeypatch):
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln import rewrites
    from kiln.codegen.pipeline import _rewrites
    from kiln.devices.builtin import CUDA
    from kiln.rewrites import pad_mm

    # pad on the CPU too, and whatever the size, so that this machine shows the rewrite
    monkeypatch.setattr(pad_mm, "MIN_WORK", 0)
    on_cpu = functools.partial(pad_mm.pad_matmuls, devices=("cpu",))
    monkeypatch.setitem(
        rewrites.REWRITES, "pad_matmuls", rewrites.Rewrite("pad_matmuls", on_cpu, "")
    )

    def head(x, w):
        return x @ w.t()

    args = (torch.randn(96, 40), torch.randn(1001, 40))
    pads = {}
    for on in (True, False):
        gm = make_fx(head)(*args)
        opts = options.build_options(options={"shape_padding": on})
        rewrites.run_rewrites(gm, list(args), _rewrites(CUDA, opts))
        pads[on] = sum(n.target is torch.ops.aten.constant_pad_nd.default for n in gm.graph.nodes)
        fresh = tuple(torch.randn_like(a) for a in args)
        torch.testing.assert_close(gm(*fresh), head(*fresh))
    assert pads == {True: 1, False: 0}
