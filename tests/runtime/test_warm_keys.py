"""What a warm start pays before its first call runs: the artifact cache's key is the same in
every process and needs no FX code generation (backends/warm.py), the capture cache's constant
tensors come back without `torch.load` (capture/graph_data.py), and a loaded wrapper program is
not compiled again (pycode.py). Every compiled run is compared with eager on fresh data."""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
import textwrap

import torch

import kiln
from kiln.backends import warm
from kiln.capture import graph_data
from kiln.codegen.compiled import WRAPPER_FILE

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")

KEY_PROGRAM = textwrap.dedent(
    """
    import sys
    from kiln.backends import warm

    def scaled(x, mode="gelu"):
        if mode in {"gelu", "tanh", "relu", "silu", "mish", "elu"}:
            return x * 2.5
        return (x, 1234567)

    # another part of the program holding the same constants: marshal's bytes of `scaled`'s
    # code follow its constants' reference counts (and so differ between processes)
    held = list(scaled.__code__.co_consts) if sys.argv[1:] == ["hold"] else []
    print(warm._function(scaled))
    """
)


def test_a_function_has_the_same_key_in_every_process(tmp_path):
    script = tmp_path / "key.py"
    script.write_text(KEY_PROGRAM)
    keys = set()
    for seed, extra in (("1", []), ("2", ["hold"]), ("3", [])):
        env = {**os.environ, "PYTHONPATH": SRC, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, str(script), *extra], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-3000:]
        keys.add(out.stdout.strip())
    assert len(keys) == 1, keys


def _graph(scale: float) -> torch.fx.GraphModule:
    def fn(x, w):
        return torch.nn.functional.gelu(x @ w + scale, approximate="tanh").sum(-1)

    gm = torch.fx.symbolic_trace(fn)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta["example_value"] = torch.randn(4, 4)
    return gm


def test_graph_key_generates_no_code_and_tells_graphs_apart(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("graph_key generated the graph's Python code")

    one, again, other = _graph(1.0), _graph(1.0), _graph(2.0)
    monkeypatch.setattr(torch.fx.Graph, "python_code", refuse)
    assert warm.graph_key(one) == warm.graph_key(again)
    assert warm.graph_key(one) != warm.graph_key(other)  # an argument's value
    for node in again.graph.nodes:
        if node.op == "call_function" and node.kwargs.get("approximate") == "tanh":
            node.kwargs = {"approximate": "none"}
    assert warm.graph_key(one) != warm.graph_key(again)  # a keyword argument's value


def test_constants_come_back_without_torch_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch.load on the capture cache's load")

    gen = torch.Generator().manual_seed(3)
    base = torch.randn(6, 5, generator=gen)
    constants = {
        "table": base,
        "view": base[1:, ::2],  # shares `table`'s storage, at an offset, strided
        "weight": torch.nn.Parameter(torch.randn(3, generator=gen).to(torch.bfloat16)),
        "index": torch.randint(0, 9, (4,), generator=gen),
        "empty": torch.empty(0, 2),
    }
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(tuple(graph.call_function(torch.mul, (x, graph.get_attr(n))) for n in constants))
    data = graph_data.dump(graph, constants, _NoEncoder())
    monkeypatch.setattr(torch, "load", refuse)
    gm = graph_data.load(data, _NoResolver())
    for name, want in constants.items():
        got = getattr(gm, name)
        assert type(got) is type(want) and got.dtype == want.dtype
        assert got.shape == want.shape and got.stride() == want.stride()
        assert got.storage_offset() == want.storage_offset()
        assert got.requires_grad == want.requires_grad and torch.equal(got, want)
    assert gm.view.untyped_storage().data_ptr() == gm.table.untyped_storage().data_ptr()


class _NoEncoder:
    def value(self, v):
        return ("plain", v)


class _NoResolver:
    def value(self, v):
        return v[1]


def test_a_loaded_wrapper_is_not_compiled_again(cache, monkeypatch):
    def fn(x, w):
        return torch.tanh(x @ w).softmax(-1) * 3.0

    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(8, 12, generator=gen), torch.randn(12, 12, generator=gen)
    with torch.no_grad():
        assert torch.allclose(kiln.compile(fn)(x, w), fn(x, w), atol=1e-5)
    kiln.reset()
    compiled_files = []
    original = builtins.compile

    def spy(source, filename, *args, **kwargs):
        compiled_files.append(filename)
        return original(source, filename, *args, **kwargs)

    monkeypatch.setattr(builtins, "compile", spy)
    before = warm.STATS["hits"]
    x, w = torch.randn(8, 12, generator=gen), torch.randn(12, 12, generator=gen)
    with torch.no_grad():
        got = kiln.compile(fn)(x, w)
    monkeypatch.setattr(builtins, "compile", original)
    assert warm.STATS["hits"] == before + 1  # loaded from the artifact cache
    assert torch.allclose(got, fn(x, w), atol=1e-5)
    assert WRAPPER_FILE not in compiled_files, compiled_files


def test_the_source_digest_is_kept_and_follows_edits(tmp_path, monkeypatch):
    from kiln import version

    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "a.py").write_text("x = 1\n")
    (root / "sub" / "b.py").write_text("y = 2\n")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    first = version.digest_of(str(root))
    reads = []
    original = builtins.open

    def spy(path, *args, **kwargs):
        if str(path).endswith(".py"):
            reads.append(path)
        return original(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    assert version.digest_of(str(root)) == first
    assert reads == []  # found under the files' identities: no file read
    (root / "sub" / "b.py").write_text("y = 3\n")
    os.utime(root / "sub" / "b.py", ns=(10**18, 10**18))
    edited = version.digest_of(str(root))
    assert edited != first and reads
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "other"))  # computed from scratch
    assert version.digest_of(str(root)) == edited
