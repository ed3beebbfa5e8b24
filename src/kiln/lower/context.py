"""The lowering context: what a lowering function uses to add loop-IR nodes.

Takes the graph's device, the nodes lowered so far and the fake output of the ATen node being
lowered; gives `pointwise(...)`, `reduction(...)`, `view(...)`, `load(...)` and the
broadcasting/type-promotion helpers that every elementwise lowering shares.

Why it exists: views are resolved here, once — `load` through a `View` becomes a load of its
base at the composed index, and a view of a view points at the root base — so kernel bodies
never mention views and the scheduler never has to look through them. Device placement is
checked here too: kernels run on the graph's device, so `load` refuses a buffer that an extern
call left on another device (a CPU scalar in a CUDA graph), and the op reading it stays an ATen
call, which handles mixed devices as eager does.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Union

import sympy
import torch

from ..devices import LOOP_DTYPES
from . import ops
from .indexing import index_vars, to_sym
from .ir import (
    BufRef,
    Expr,
    IntExpr,
    Load,
    Node,
    Pointwise,
    Reduction,
    View,
    compute_dtype,
    node_dtype,
    node_size,
)
from .registry import Unsupported
from .symbolic import TrueDiv, from_torch

Scalar = Union[bool, int, float]


class LoweringContext:
    def __init__(
        self,
        *,
        device: torch.device | None = None,
        indirect_loads: bool = False,
        dtypes: frozenset = LOOP_DTYPES,
    ) -> None:
        # The graph's device: kernels run there and the wrapper allocates their buffers there.
        self.device = device if device is not None else torch.device("cpu")
        self.elsewhere: dict[str, torch.device] = {}  # extern outputs on another device
        # The device's capabilities (devices.Capabilities): may lowerings emit `Indirect` index
        # terms (loads at indices read from memory), and which dtypes kernels may touch.
        self.indirect_loads = indirect_loads
        self.dtypes = dtypes
        self.checks: dict = {}  # (index buffer, size, wrap) -> its bounds check (indirect.py)
        self.nodes: dict[str, Node] = {}
        self._ids = itertools.count()
        # The fake value of the node being lowered: a tensor, or a tuple/list of them (and
        # None entries) for an op with several outputs.
        self.out: torch.Tensor | tuple | list | None = None
        self.op: torch._ops.OpOverload | None = None  # the ATen overload being lowered
        self.symbolic = False  # does the graph have symbolic sizes (lower/symbolic.py)?

    # -- nodes ------------------------------------------------------------------------------
    def fresh(self, prefix: str = "buf") -> str:
        return f"{prefix}{next(self._ids)}"

    def add(self, node: Node) -> BufRef:
        assert node.name not in self.nodes, node.name
        self.nodes[node.name] = node
        return BufRef(node.name)

    def node(self, ref: BufRef) -> Node:
        return self.nodes[ref.name]

    def size(self, ref: BufRef) -> tuple:
        return tuple(node_size(self.nodes[ref.name]))

    def dtype(self, ref: BufRef) -> torch.dtype:
        return node_dtype(self.nodes[ref.name])

    def on_graph_device(self, device: torch.device) -> bool:
        """Is `device` the graph's (same type; same index when both name one)?"""
        mine = self.device
        if device.type != mine.type:
            return False
        return device.index is None or mine.index is None or device.index == mine.index

    def _single_out(self) -> torch.Tensor:
        assert isinstance(self.out, torch.Tensor), "an op with several outputs reads ctx.out[k]"
        return self.out

    @property
    def out_size(self) -> tuple:
        return tuple(from_torch(s) for s in self._single_out().shape)

    @property
    def out_dtype(self) -> torch.dtype:
        return self._single_out().dtype

    # -- expressions ------------------------------------------------------------------------
    def load(self, ref: BufRef, index: Iterable[IntExpr], dtype: torch.dtype | None = None) -> Expr:
        node = self.nodes[ref.name]
        index = tuple(to_sym(i) for i in index)
        assert len(index) == len(node_size(node)), (ref, index)
        if isinstance(node, View):
            sub = dict(zip(index_vars(len(node.size)), index))
            index = tuple(e.xreplace(sub) for e in node.index)
            node = self.nodes[node.base]
        if node.name in self.elsewhere:
            raise Unsupported(
                f"reads {node.name}, a tensor on {self.elsewhere[node.name]}, in a graph whose "
                f"kernels run on {self.device}"
            )
        e: Expr = Load(node.name, index, compute_dtype(node_dtype(node)))
        return ops.cast(e, dtype) if dtype is not None else e

    def broadcast_load(self, value: object, size: tuple, dtype: torch.dtype) -> Expr:
        """`value` (a tensor or a Python scalar) read at the loop index of `size`, broadcast."""
        if not isinstance(value, BufRef):
            if isinstance(value, (bool, int, float)):
                return ops.const(value, dtype)
            if isinstance(value, sympy.Basic):  # a symbolic size, or float arithmetic on sizes
                return ops.cast(size_scalar(value), dtype)
            raise Unsupported(f"argument of type {type(value).__name__}")
        vars_ = index_vars(len(size))
        own = self.size(value)
        lead = len(size) - len(own)
        index = [
            sympy.Integer(0) if own[k] == 1 and size[lead + k] != 1 else vars_[lead + k]
            for k in range(len(own))
        ]
        return self.load(value, index, dtype)

    def promote(self, *args: BufRef | Scalar) -> torch.dtype:
        """torch's type promotion for these arguments (tensors by dtype and rank, scalars)."""
        metas: list[torch.Tensor | Scalar] = []
        for a in args:
            if isinstance(a, BufRef):
                ndim = len(self.size(a))
                metas.append(torch.empty((1,) * ndim, dtype=self.dtype(a), device="meta"))
            else:
                metas.append(a)
        out = metas[0] if isinstance(metas[0], torch.Tensor) else torch.tensor(metas[0])
        dtype = out.dtype
        for m in metas[1:]:
            dtype = torch.result_type(out, m)
            out = (
                torch.empty((), dtype=dtype, device="meta")
                if not isinstance(out, torch.Tensor)
                else torch.empty(out.shape, dtype=dtype, device="meta")
            )
        return dtype

    # -- node builders ----------------------------------------------------------------------
    def pointwise(self, size: Iterable[IntExpr], dtype: torch.dtype, body: Expr) -> BufRef:
        size = tuple(size)
        body = ops.cast(body, compute_dtype(dtype))
        return self.add(Pointwise(self.fresh(), size, dtype, body))

    def elementwise(
        self,
        args: Iterable[object],
        fn: Callable[..., Expr],
        compute: torch.dtype | None = None,
    ) -> BufRef:
        """The common elementwise lowering: broadcast `args` to the output, compute, store."""
        size, out_dtype = self.out_size, self.out_dtype
        compute = compute_dtype(compute or out_dtype)
        loaded = [self.broadcast_load(a, size, compute) for a in args]
        return self.pointwise(size, out_dtype, fn(*loaded))

    def reduction(
        self,
        size: Iterable[IntExpr],
        dtype: torch.dtype,
        reduce_type: str,
        reduce_size: Iterable[IntExpr],
        body: Expr,
    ) -> BufRef:
        return self.add(
            Reduction(self.fresh(), tuple(size), dtype, reduce_type, tuple(reduce_size), body)
        )

    def view(self, ref: BufRef, size: Iterable[int], index: Iterable[IntExpr]) -> BufRef:
        """A view of `ref` whose element `i` is `ref[index(i)]`; views of views are flattened."""
        node = self.nodes[ref.name]
        index = tuple(to_sym(i) for i in index)
        if isinstance(node, View):
            sub = dict(zip(index_vars(len(node.size)), index))
            index = tuple(e.xreplace(sub) for e in node.index)
            base = node.base
        else:
            base = node.name
        size = tuple(from_torch(s) for s in size)
        if base == ref.name and size == self.size(ref) and index == index_vars(len(size)):
            return ref
        return self.add(View(self.fresh("view"), base, size, node_dtype(node), index))


def size_scalar(e: sympy.Basic) -> Expr:
    """A scalar computed from symbolic sizes as a loop-IR value: an integer expression is one
    index value; float arithmetic on sizes (`TrueDiv`, float constants: a SymFloat such as
    batch norm's `n / (n - 1)`) is computed in float64 from its integer parts, as eager
    computes a SymFloat in Python floats."""
    if e.is_Integer or (e.free_symbols and e.is_integer):
        return ops.IndexValue(e, torch.int64) if e.free_symbols else ops.const(int(e), torch.int64)
    if e.is_Number:
        return ops.const(float(e), torch.float64)
    f64 = torch.float64
    parts = [ops.cast(size_scalar(a), f64) for a in e.args]
    if isinstance(e, TrueDiv):
        return ops.div(*parts)
    if isinstance(e, (sympy.Add, sympy.Mul)):
        out = parts[0]
        for p in parts[1:]:
            out = ops.add(out, p) if isinstance(e, sympy.Add) else ops.mul(out, p)
        return out
    if isinstance(e, sympy.Pow) and e.args[1].is_Integer:
        n = int(e.args[1])
        out = parts[0]
        for _ in range(abs(n) - 1):
            out = ops.mul(out, parts[0])
        return ops.div(ops.const(1.0, f64), out) if n < 0 else out
    raise Unsupported(f"a size expression {e} ({type(e).__name__}) as a value")
