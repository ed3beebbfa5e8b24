"""Logging, warnings and cached helpers inside compiled code keep one graph (effect_calls.py),
and a break inside a property getter resumes in a continuation instead of running the whole
function eagerly. Every case compares outputs and the log lines or warnings with eager's, on
fresh random inputs, and counts graphs and breaks."""

import functools
import logging
import warnings

import pytest
import torch
from harness import CountingBackend, check

import kiln

logger = logging.getLogger("kiln.tests.effects")


@kiln.disable
def disabled_helper(y):
    return y * 1.25


class Records(logging.Handler):
    """The messages one logger emits (its level set for the test, restored after)."""

    def __init__(self, log: logging.Logger, level=logging.DEBUG):
        super().__init__(level=logging.DEBUG)
        self.log, self.level_ = log, level
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(f"{record.levelname}:{record.getMessage()}")

    def __enter__(self):
        self.old = (self.log.level, self.log.propagate)
        self.log.addHandler(self)
        self.log.setLevel(self.level_)
        self.log.propagate = False
        return self

    def __exit__(self, *exc):
        self.log.removeHandler(self)
        self.log.setLevel(self.old[0])
        self.log.propagate = self.old[1]


def _one_graph(cf, backend, graphs=1):
    state = cf._kiln_compiled
    assert state.eager_reason is None, state.eager_reason
    assert not state.breaks, state.breaks
    assert len(backend.graphs) == graphs, f"{len(backend.graphs)} graphs"


# ---- a break inside a property getter resumes ----------------------------------------------------
class Scaled:
    def __init__(self, t):
        self.t = t

    @property
    def value(self):
        y = self.t.cos()
        y = disabled_helper(y)  # the break: the getter's caller is an attribute load
        return y + 1

    @property
    def fn(self):
        s = disabled_helper(self.t.sin())
        return lambda x: x * s


def test_break_inside_property_resumes_after_the_attribute_load():
    def prog(x, h):
        y = x * 2
        return (h.value * y).sum(0), h.value.sum()

    cf, _ = check(prog, lambda: (torch.randn(3), Scaled(torch.randn(3))), graphs=3)
    assert cf._kiln_compiled.breaks


def test_break_inside_property_loaded_as_a_method():
    def prog(x, h):
        return h.fn(x + 1).exp()

    check(prog, lambda: (torch.randn(4), Scaled(torch.randn(4))), graphs=2)


# ---- logging -------------------------------------------------------------------------------------
def _log_prog(x):
    y = x.relu() + 1
    logger.debug("debug %d", 3)
    logger.info("shape %s", tuple(y.shape))
    logger.warning("sum %.4f", y.sum())  # a tensor argument: formatted from the graph's output
    logging.getLogger("kiln.tests.effects").log(logging.ERROR, "error %s", "text")
    return y * 2


@pytest.mark.parametrize("level", [logging.DEBUG, logging.WARNING])
def test_logging_is_replayed_after_one_graph(level):
    backend = CountingBackend()
    cf = kiln.compile(_log_prog, backend=backend)
    for _ in range(3):
        x = torch.randn(4, 3)
        with Records(logger, level) as eager_log:
            expected = _log_prog(x.clone())
        with Records(logger, level) as got_log:
            got = cf(x.clone())
        torch.testing.assert_close(got, expected)
        assert got_log.messages == eager_log.messages
        assert got_log.messages  # the error line at least
    _one_graph(cf, backend)


def test_disabled_level_costs_no_break_and_follows_level_changes():
    def prog(x):
        logger.debug("value %s", "v")
        return x + 1

    backend = CountingBackend()
    cf = kiln.compile(prog, backend=backend)
    for level, lines in ((logging.INFO, 0), (logging.INFO, 0), (logging.DEBUG, 1)):
        x = torch.randn(3)
        with Records(logger, level) as log:
            torch.testing.assert_close(cf(x), x + 1)
        assert len(log.messages) == lines
    _one_graph(cf, backend)


def test_transformers_warning_once_fires_once_across_calls():
    tlog = pytest.importorskip("transformers.utils.logging")
    hf_logger = tlog.get_logger("kiln.tests.effects.hf")

    def prog(x, n):
        hf_logger.warning_once(f"computed {n} rows")
        hf_logger.warning_advice("advice")
        return x * n

    backend = CountingBackend()
    cf = kiln.compile(prog, backend=backend)
    with Records(hf_logger, logging.INFO) as log:
        for _ in range(3):
            x = torch.randn(5)
            torch.testing.assert_close(cf(x, 3), x * 3)
    assert log.messages == ["WARNING:computed 3 rows"] + ["WARNING:advice"] * 3
    _one_graph(cf, backend)


# ---- warnings ------------------------------------------------------------------------------------
def _warn_prog(x):
    y = x.abs() + 0.5
    warnings.warn("careful", UserWarning)  # noqa: B028 - stacklevel 1
    _warn_helper()
    return y.log()


def _warn_helper():
    warnings.warn("from the caller's line", FutureWarning, stacklevel=2)


@pytest.mark.parametrize("action", ["default", "always", "ignore"])
def test_warnings_keep_eager_filters_and_locations(action):
    backend = CountingBackend()
    cf = kiln.compile(_warn_prog, backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action)
        for _ in range(3):
            x = torch.randn(4)
            torch.testing.assert_close(cf(x), (x.abs() + 0.5).log())
    got = [(str(w.message), w.category, w.filename, w.lineno) for w in caught]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action)
        for _ in range(3):
            _warn_prog(torch.randn(4))
    expected = [(str(w.message), w.category, w.filename, w.lineno) for w in caught]
    assert got == expected
    assert len(got) == {"default": 2, "always": 6, "ignore": 0}[action]
    _one_graph(cf, backend)


def test_warning_filter_error_raises_on_a_later_call():
    cf = kiln.compile(_warn_prog, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cf(torch.randn(4))
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="careful"):
            cf(torch.randn(4))


# ---- lru_cache-wrapped helpers -------------------------------------------------------------------
SETTINGS = {"scale": 2.0}


@functools.lru_cache
def cached_scale(name: str) -> float:
    return SETTINGS[name]


@functools.cache
def use_fast_path() -> bool:
    return SETTINGS["scale"] > 1


@functools.lru_cache(maxsize=8)
def cached_of_tensor(t):
    return t * 3


def test_cached_helpers_are_one_graph_and_follow_cache_clear():
    def prog(x):
        y = x * cached_scale("scale")
        if use_fast_path():
            y = y + 1
        return cached_of_tensor(y).sum(0)

    def expected(x):
        return (x * SETTINGS["scale"] + (1 if SETTINGS["scale"] > 1 else 0)) * 3

    backend = CountingBackend()
    cf = kiln.compile(prog, backend=backend)
    try:
        for _ in range(3):
            x = torch.randn(3, 2)
            torch.testing.assert_close(cf(x), expected(x).sum(0))
        _one_graph(cf, backend)
        SETTINGS["scale"] = 0.5  # eager still answers from the cache ...
        x = torch.randn(3, 2)
        torch.testing.assert_close(cf(x), prog(x))
        assert len(backend.graphs) == 1
        cached_scale.cache_clear()  # ... until it is cleared: then the helper runs again
        use_fast_path.cache_clear()
        x = torch.randn(3, 2)
        torch.testing.assert_close(cf(x), expected(x).sum(0))
        assert len(backend.graphs) == 2
    finally:
        SETTINGS["scale"] = 2.0
        cached_scale.cache_clear()
        use_fast_path.cache_clear()


def test_transformers_cached_availability_helpers_do_not_break():
    import_utils = pytest.importorskip("transformers.utils.import_utils")

    def prog(x):
        if import_utils.is_torch_distributed_available():
            x = x + 1
        if import_utils.is_torch_available():
            x = x * 2
        return x.tanh()

    cf, backend = check(prog, lambda: (torch.randn(3),))
    assert not cf._kiln_compiled.breaks
