"""An exception raised by user code in a compiled function carries the traceback eager Python
gives it: the user's frames, ending at the line that raised (and below it only frames that
really ran there, such as a library's), with none of kiln's interpreter frames after the
first user frame; type, message, cause and context unchanged. Checked on the call that traces,
on later calls served by compiled entries and continuations, and on the eager fallback."""

from __future__ import annotations

import inspect
import os
import traceback

import pytest
import torch

import kiln

KILN_DIR = os.path.dirname(kiln.__file__)


def _line(fn, marker: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, text in enumerate(lines) if marker in text)


def check_limit(t, limit):
    if t.abs().max().item() > limit:  # a graph break (a Python bool of tensor data)
        raise ValueError(f"too big: over {limit}")  # RAISES
    return t


def prog(x, limit):
    y = x * 2 + 1
    z = check_limit(y, limit)  # CALLS
    return z.sin()


def with_cause(x):
    try:
        return {"a": x}["b"]
    except KeyError as e:
        raise RuntimeError("no b") from e  # RAISES FROM


def _frames_from(exc, fn):
    """The traceback's frames from the compiled function's own frame on."""
    frames = traceback.extract_tb(exc.__traceback__)
    first = next(i for i, f in enumerate(frames) if f.name == fn.__name__)
    return frames[first:]


def _assert_user_tb(exc, expected):
    """`expected`: (function, marker) pairs, outermost first, that must end the traceback."""
    text = "".join(traceback.format_exception(exc))
    frames = _frames_from(exc, expected[0][0])
    assert not [f for f in frames if f.filename.startswith(KILN_DIR)], text
    tail = [(f.name, f.lineno, f.filename) for f in frames[-len(expected) :]]
    want = [(fn.__name__, _line(fn, marker), __file__) for fn, marker in expected]
    assert tail == want, text
    own = "".join(traceback.format_tb(exc.__traceback__))
    assert "kiln/capture" not in own.split(f"in {expected[0][0].__name__}\n", 1)[1], text


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_raise_in_an_inlined_function_shows_the_users_frames(backend):
    compiled = kiln.compile(prog, backend=backend)
    x = torch.rand(4, 3)
    torch.testing.assert_close(compiled(x, 100.0), prog(x, 100.0))  # traces, no raise
    for _ in range(3):  # compiled entry + continuation, then again
        with pytest.raises(ValueError) as eager:
            prog(x, 0.5)
        with pytest.raises(ValueError) as got:
            compiled(x, 0.5)
        assert str(got.value) == str(eager.value) == "too big: over 0.5"
        _assert_user_tb(got.value, [(prog, "# CALLS"), (check_limit, "# RAISES")])


def test_raise_on_the_tracing_call():
    compiled = kiln.compile(prog, backend="eager")
    with pytest.raises(ValueError, match="too big") as got:
        compiled(torch.rand(3) + 1, 0.5)
    _assert_user_tb(got.value, [(prog, "# CALLS"), (check_limit, "# RAISES")])


def cat_mismatch(x, y):
    z = x + 1
    return torch.cat([z, y], dim=1)  # TORCH RAISES


def test_a_torch_error_points_at_the_users_line():
    compiled = kiln.compile(cat_mismatch, backend="eager")
    x, y = torch.randn(2, 3), torch.randn(4, 3)
    with pytest.raises(RuntimeError) as eager:
        cat_mismatch(x, y)
    with pytest.raises(RuntimeError) as got:
        compiled(x, y)
    assert str(got.value) == str(eager.value)
    _assert_user_tb(got.value, [(cat_mismatch, "# TORCH RAISES")])


def test_cause_and_its_traceback_are_the_users():
    compiled = kiln.compile(with_cause, backend="eager")
    with pytest.raises(RuntimeError, match="no b") as got:
        compiled(torch.randn(2))
    exc = got.value
    assert isinstance(exc.__cause__, KeyError) and exc.__cause__.args == ("b",)
    _assert_user_tb(exc, [(with_cause, "# RAISES FROM")])
    cause_frames = traceback.extract_tb(exc.__cause__.__traceback__)
    assert cause_frames[-1].name == "with_cause"
    assert not [f for f in cause_frames if f.filename.startswith(KILN_DIR)]


def reraised_by_with(x, log):
    with Recorder(log):
        y = x * 3
        raise KeyError("inside with")  # WITH RAISES
    return y


class Recorder:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")

    def __exit__(self, *exc):
        self.log.append(exc[0].__name__ if exc[0] else None)
        return False


def test_an_exception_through_with_keeps_its_line():
    compiled = kiln.compile(reraised_by_with, backend="eager")
    log, eager_log = [], []
    with pytest.raises(KeyError):
        reraised_by_with(torch.randn(2), eager_log)
    with pytest.raises(KeyError) as got:
        compiled(torch.randn(2), log)
    assert log == eager_log == ["enter", "KeyError"]
    _assert_user_tb(got.value, [(reraised_by_with, "# WITH RAISES")])
