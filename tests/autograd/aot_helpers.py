"""Test helpers: graphs shaped like capture's output, and comparisons with eager PyTorch.

`lift(module, n_inputs)` traces a module with `torch.fx` *into* its submodules (no leaf
modules) and turns every parameter, buffer and tensor constant it reads into a placeholder
after the user inputs, as kiln's capture lifts them. It gives the graph (whose `lifted_names`
are the tensors' qualified names) and the lifted tensors. `compare` runs the eager graph and
the compiled one on separate clones of the same fresh random inputs and checks outputs,
gradients of every input that requires grad, and mutated inputs.
"""

from __future__ import annotations

import functools

import torch
import torch.fx

from kiln.autograd.backend import aot_eager


class _IntoModules(torch.fx.Tracer):
    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        return False


def lift(module: torch.nn.Module, n_inputs: int) -> tuple[torch.fx.GraphModule, list]:
    """(graph taking user inputs then lifted params/buffers, the lifted tensors in order)."""
    graph = _IntoModules().trace(module)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == n_inputs, "lift: the module's forward has a different arity"
    lifted: dict[str, torch.fx.Node] = {}
    tensors = []
    last = placeholders[-1]
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        if node.target not in lifted:
            with graph.inserting_after(last):
                ph = graph.placeholder("L_" + node.target.replace(".", "_"))
            last = ph
            lifted[node.target] = ph
            tensors.append(functools.reduce(getattr, node.target.split("."), module))
        node.replace_all_uses_with(lifted[node.target])
        graph.erase_node(node)
    out = next(n for n in graph.nodes if n.op == "output")
    if not isinstance(out.args[0], (tuple, list)):
        out.args = ((out.args[0],),)
    graph.lint()
    gm = torch.fx.GraphModule(module, graph)
    gm.lifted_names = list(lifted)  # qualified names, in the order of `tensors`
    return gm, tensors


def clone_inputs(inputs: list) -> list:
    """Independent copies that keep requires_grad (as leaves)."""
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            c = x.detach().clone()
            out.append(c.requires_grad_(x.requires_grad))
        else:
            out.append(x)
    return out


def assert_close(actual, expected, what: str, **tol) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{what}: expected a tensor, got {actual!r}"
        assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
        assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
        torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}", **tol)
    else:
        assert actual == expected, f"{what}: {actual!r} != {expected!r}"


def run_and_backward(fn, inputs: list, seed: int | None):
    if seed is not None:
        torch.manual_seed(seed)
    outs = fn(*inputs)
    diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    if diff:
        # a fixed random weighting per output, so every output's gradient path is exercised
        gen = torch.Generator().manual_seed(1234)
        loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in diff)
        loss.backward()
    return outs


def compare(
    gm: torch.fx.GraphModule,
    inputs: list,
    *,
    compiled=None,
    backend=aot_eager,
    seed: int | None = None,
    calls: int = 2,
    **tol,
):
    """Compile `gm` with `backend` (unless `compiled` is given) and check it against eager,
    `calls` times on the same inputs' clones (the second call runs the cached entry)."""
    if compiled is None:
        compiled = backend(gm, clone_inputs(inputs))
    for _ in range(calls):
        ref_in, got_in = clone_inputs(inputs), clone_inputs(inputs)
        ref_out = run_and_backward(gm, ref_in, seed)
        got_out = run_and_backward(compiled, got_in, seed)
        assert len(got_out) == len(ref_out)
        for k, (g, r) in enumerate(zip(got_out, ref_out)):
            assert_close(g, r, f"output {k}", **tol)
            if isinstance(r, torch.Tensor):
                assert g.requires_grad == r.requires_grad, f"output {k}: requires_grad differs"
        for k, (g, r, x) in enumerate(zip(got_in, ref_in, inputs)):
            if not isinstance(r, torch.Tensor):
                continue
            assert_close(g, r, f"input {k} after the call (mutation)", **tol)
            if x.requires_grad:
                assert (g.grad is None) == (r.grad is None), f"input {k}: grad presence differs"
                if r.grad is not None:
                    assert_close(g.grad, r.grad, f"grad of input {k}", **tol)
    return compiled


def trains_like_eager(program, shapes: list[tuple], backend: str, calls: int = 3):
    """`kiln.compile(program, backend=backend)` called `calls` times on fresh random inputs of
    `shapes` that require grad: the output and every input's gradient (against a random output
    gradient) equal eager's, and no graph fell back to eager kernels. Gives the compiled
    function."""
    import kiln
    from kiln.backends import builtin

    compiled = kiln.compile(program, backend=backend)
    before = len(builtin.fallbacks())
    for _ in range(calls):
        inputs = [torch.randn(s, requires_grad=True) for s in shapes]
        eager_inputs = clone_inputs(inputs)
        got, expected = compiled(*inputs), program(*eager_inputs)
        torch.testing.assert_close(got, expected)
        g = torch.randn_like(got)
        got.backward(g)
        expected.backward(g)
        for x, xe in zip(inputs, eager_inputs):
            torch.testing.assert_close(x.grad, xe.grad)
    assert builtin.fallbacks()[before:] == []
    return compiled
