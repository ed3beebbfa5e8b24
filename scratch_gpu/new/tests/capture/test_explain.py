"""kiln.explain and the `kiln explain` command report graphs, op counts, breaks with reason,
source line and hint, guards and compiles."""

import subprocess
import sys
import textwrap

import torch

import kiln


def f(x):
    y = x.sin() * 2
    if y.sum() > 0:  # a graph break
        y = y + 1
    return y.cos()


def test_explain_function():
    out = kiln.explain(f)(torch.rand(4))
    assert out.graph_count == 2 and out.graph_break_count == 1 and out.compiles == 2
    reason, where, hint = out.breaks[0]
    assert "Tensor.__bool__" in reason and "if y.sum() > 0" in where and "torch.where" in hint
    counts = out.op_counts()
    assert counts[0]["sin"] == 1 and counts[1]["cos"] == 1
    text = str(out)
    assert "graphs: 2" in text and "break 0" in text and "L['x']" in text


def test_explain_without_breaks():
    out = kiln.explain(lambda x: (x @ x.t()).relu())(torch.randn(3, 3))
    assert out.graph_count == 1 and out.graph_break_count == 0
    assert sum(out.op_counts()[0].values()) == 3


def test_kiln_explain_command(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(
        textwrap.dedent("""
        import torch, kiln

        @kiln.compile
        def step(x):
            y = x * 3
            print("norm", y.norm())
            return y - 1

        for _ in range(2):
            step(torch.randn(5))
    """)
    )
    done = subprocess.run(
        [sys.executable, "-m", "kiln", "explain", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "kiln explain: step" in done.stdout
    assert "graph breaks: 1" in done.stdout
    assert "print() of a tensor" in done.stdout and 'print("norm", y.norm())' in done.stdout
