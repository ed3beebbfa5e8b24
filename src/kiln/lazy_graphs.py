"""GraphModules that write their Python code only when something needs it.

`torch.fx.GraphModule` generates and compiles Python source for its graph when it is built and
at every `recompile()`. kiln's stages mostly read graphs (AOT autograd partitions the joint
graph; the code generators lower the forward and backward graphs) and run few of them, so that
code is usually never used (in a cProfile of a six-layer GPT's training compile with
`aot_eager` on the 2-core CPU machine, six recompiles took 0.20 of 1.43 s).
`_LazyGraphModule` (torch.fx) writes it on first use instead: a call, `.code`,
`print_readable`. With a torch that lacks it, these names fall back to the eager behaviour.

- `LazyGraphModule(root, graph, class_name=...)`: a `GraphModule` built lazily.
- `lazy_graph_modules()`: a context in which torch.fx (`make_fx` among others) builds its
  GraphModules lazily.
"""

from __future__ import annotations

import contextlib

import torch.fx

try:
    from torch.fx._lazy_graph_module import _LazyGraphModule as LazyGraphModule
    from torch.fx._lazy_graph_module import _use_lazy_graph_module
except ImportError:  # an older torch: generate the code at once
    LazyGraphModule = torch.fx.GraphModule
    _use_lazy_graph_module = None


def lazy_graph_modules():
    """A context in which torch.fx builds lazy GraphModules (see the module doc)."""
    if _use_lazy_graph_module is None:
        return contextlib.nullcontext()
    return _use_lazy_graph_module(True)
