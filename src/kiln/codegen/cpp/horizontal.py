"""C++ horizontal kernels: independent pointwise kernels run in one call and one parallel region.

Takes a horizontal `Kernel` (schedule/horizontal.py: its `parts` read nothing another part
writes) and the graph's nodes; gives one `CppKernel` whose arguments are the parts' buffers.

Shape: one `#pragma omp parallel` region around every part's loops, each rendered as
renderer.py renders a kernel of its own, with its work-sharing construct changed from
`parallel for` to an orphaned `omp for ... nowait`: each part's elements (or rows) are divided
among all threads of the one team, and a thread that finishes its share of one part goes on
to its share of the next without waiting at a barrier (the parts are independent). A part too
small to divide (below PARALLEL_MIN_ELEMENTS, where a kernel of its own would run serially) is
an `omp single nowait` block: the first thread to reach it runs it while the others go on, so
many small parts spread over the team. A group whose elements all together are below that
size runs serially, with no region.

Why it exists: the few ops of a foreach optimizer step over every parameter were one kernel
per parameter size, each a ctypes call and a thread fork and join (GPT-2's AdamW: 36).
"""

from __future__ import annotations

from ...lower.ir import Pointwise
from ...schedule import Kernel
from .renderer import (
    PARALLEL_MIN_ELEMENTS,
    CppKernel,
    _KernelContext,
    _signature,
    _size_params,
    kernel_loop,
)


def render_group(kernel: Kernel, nodes: dict, aliased: frozenset = frozenset()) -> CppKernel:
    """`aliased`: buffers that share memory with another one (schedule/inplace.py)."""
    team = kernel.outer * kernel.inner >= PARALLEL_MIN_ELEMENTS
    params: dict[str, bool] = {}  # buffer -> written by some part
    body: list[str] = []
    for part in kernel.parts:
        assert all(isinstance(nodes[m.name], Pointwise) for m in part.members)
        k = _KernelContext(part, nodes)
        k.aliased = aliased
        shared = team and part.outer * part.inner >= PARALLEL_MIN_ELEMENTS
        rows = shared and part.outer > 1  # rows shared among threads, else a row's elements
        flat = "#pragma omp for simd nowait" if shared and not rows else "#pragma omp simd"
        loop = kernel_loop(k, flat)
        body.append(f"  // {part}")
        if rows:  # (the work-sharing pragma right before the loop it shares)
            body += ["  {", "  #pragma omp for nowait", *loop, "  }"]
        elif team and not shared:
            body += ["  #pragma omp single nowait", "  {", *loop, "  }"]
        else:
            body += ["  {", *loop, "  }"]
        for name, written in k.params.items():
            params[name] = params.get(name, False) or written
    ctx = _KernelContext(kernel, nodes)  # for the signature: every part's buffers
    ctx.params, ctx.aliased = params, aliased
    names = tuple(params)
    sizes = _size_params(body)
    assert not sizes, "horizontal kernels are of static sizes (schedule/horizontal.py)"
    lines = [f'extern "C" void {kernel.name}({_signature(ctx, nodes, names, ())}) {{']
    if team:
        lines += ["  #pragma omp parallel", "  {", *["  " + b for b in body], "  }"]
    else:
        lines += body
    lines.append("}")
    return CppKernel(kernel.name, names, "\n".join(lines))
