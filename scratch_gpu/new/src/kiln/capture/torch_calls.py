"""What a torch call is, for the recorder: a graph op, a metadata read, a data read, or a call
the graph cannot hold; and which FX node stands for it.

Takes the `func` a TorchFunctionMode receives (a torch function, a Tensor method, an operator
dunder, a property getter); gives its kind and a readable node target (`operator.add` for
`Tensor.__add__`, `call_method("view")` for `Tensor.view`, `getattr(x, "T")` for a property).
Routing is generic: any torch function is a graph op unless a table here says otherwise.
"""

from __future__ import annotations

import operator
import types
from typing import Any

import torch

# Reads that depend only on sizes, strides, dtype, device and flags: answered, never recorded.
METADATA = {
    "size",
    "dim",
    "ndimension",
    "stride",
    "numel",
    "nelement",
    "is_contiguous",
    "is_floating_point",
    "is_complex",
    "is_signed",
    "element_size",
    "storage_offset",
    "get_device",
    "__len__",
    "is_leaf",
    "requires_grad",
    "shape",
    "dtype",
    "device",
    "ndim",
    "layout",
    "is_cuda",
    "is_cpu",
    "is_sparse",
    "is_quantized",
    "is_meta",
    "is_mkldnn",
    "is_nested",
    "names",
    "has_names",
    "is_inference",
    "__hash__",
    "grad_fn",
    "output_nr",
    "is_tensor",
    "is_nonzero_size",
    "is_mps",
    "is_xpu",
    "itemsize",
    "nbytes",
    "_is_view",
    "is_conj",
    "is_neg",
    "__instancecheck__",
    "type_as_str",
    "__dir__",
    "is_same_size",
    "get_default_dtype",
    "is_grad_enabled",
    "is_autocast_enabled",
}

# Calls that turn tensor data into Python values: a graph cannot hold them (a graph break).
DATA = {
    "item",
    "tolist",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__complex__",
    "numpy",
    "__array__",
    "equal",
    "allclose",
    "is_nonzero",
    "data_ptr",
    "__repr__",
    "__str__",
    "__format__",
    "__contains__",
    "_local_scalar_dense",
}

# Calls with effects a graph cannot replay.
UNSUPPORTED = {
    "backward",
    "register_hook",
    "retain_grad",
    "grad",
    "untyped_storage",
    "storage",
    "record_stream",
    "__deepcopy__",
    "__reduce_ex__",
    "__setstate__",
    "__getstate__",
    "register_post_accumulate_grad_hook",
    "__set__",
    "__delete__",
    "_base",
    "share_memory_",
}

MUTATION = {"__setitem__"}

# Grad-mode and autocast switches: run as they are; the tracer records the state they leave
# behind (Tracer.sync_state) rather than the call.
STATE = {
    "_set_grad_enabled",
    "set_autocast_enabled",
    "set_autocast_dtype",
    "autocast_increment_nesting",
    "autocast_decrement_nesting",
    "clear_autocast_cache",
    "set_autocast_cache_enabled",
    "is_autocast_cache_enabled",
    "get_autocast_dtype",
}

BINARY = {
    "__add__": operator.add,
    "__sub__": operator.sub,
    "__mul__": operator.mul,
    "__truediv__": operator.truediv,
    "__floordiv__": operator.floordiv,
    "__mod__": operator.mod,
    "__pow__": operator.pow,
    "__matmul__": operator.matmul,
    "__and__": operator.and_,
    "__or__": operator.or_,
    "__xor__": operator.xor,
    "__lshift__": operator.lshift,
    "__rshift__": operator.rshift,
    "__eq__": operator.eq,
    "__ne__": operator.ne,
    "__lt__": operator.lt,
    "__le__": operator.le,
    "__gt__": operator.gt,
    "__ge__": operator.ge,
    "__getitem__": operator.getitem,
    "__setitem__": operator.setitem,
    "__iadd__": operator.iadd,
    "__isub__": operator.isub,
    "__imul__": operator.imul,
    "__itruediv__": operator.itruediv,
    "__ifloordiv__": operator.ifloordiv,
    "__imod__": operator.imod,
    "__ipow__": operator.ipow,
    "__iand__": operator.iand,
    "__ior__": operator.ior,
    "__ixor__": operator.ixor,
    "__imatmul__": operator.imatmul,
    "__ilshift__": operator.ilshift,
    "__irshift__": operator.irshift,
}
REFLECTED = {
    "__radd__": operator.add,
    "__rsub__": operator.sub,
    "__rmul__": operator.mul,
    "__rtruediv__": operator.truediv,
    "__rfloordiv__": operator.floordiv,
    "__rmod__": operator.mod,
    "__rpow__": operator.pow,
    "__rmatmul__": operator.matmul,
    "__rand__": operator.and_,
    "__ror__": operator.or_,
    "__rxor__": operator.xor,
    "__rlshift__": operator.lshift,
    "__rrshift__": operator.rshift,
}
UNARY = {
    "__neg__": operator.neg,
    "__pos__": operator.pos,
    "__invert__": operator.invert,
    "__abs__": operator.abs,
}


class CallInfo:
    """What the recorder needs to know about one `func`, worked out once per func: its kind
    (call, metadata, data, unsupported, mutation, iter), the label a person reads, whether it
    changes a tensor it is given by name (`x.add_(y)`), and how its FX node is written
    (`order`: getter, binary, reflected, unary or other; `target` for the operator forms)."""

    __slots__ = ("func", "kind", "label", "name", "method", "order", "target", "in_place")

    def __init__(self, func) -> None:
        name, getter = func_name(func)
        if name in METADATA or name in STATE:
            kind = "metadata"
        elif name in DATA:
            kind = "data"
        elif name in UNSUPPORTED:
            kind = "unsupported"
        elif name in MUTATION:
            kind = "mutation"
        elif name == "__iter__":
            kind = "iter"
        else:
            kind = "call"
        self.func, self.kind, self.name = func, kind, name
        self.method = _is_tensor_method(func, name)
        self.label = f"Tensor.{name}" if self.method or getter else _qualified(func)
        self.in_place = self.label.endswith("_") and not self.label.startswith("_")
        self.order, self.target = "other", None
        if getter:
            self.order, self.target = "getter", getattr
        elif name in BINARY:
            self.order, self.target = "binary", BINARY[name]
        elif name in REFLECTED:
            self.order, self.target = "reflected", REFLECTED[name]
        elif name in UNARY:
            self.order, self.target = "unary", UNARY[name]


_cache: dict[Any, CallInfo] = {}
_getters: dict[Any, CallInfo] = {}  # property getters, by their descriptor


def func_name(func) -> tuple[str, bool]:
    """The name a person knows the call by, and whether it is a property getter."""
    name = getattr(func, "__name__", None) or type(func).__name__
    if name == "__get__" and hasattr(func, "__self__"):
        return getattr(func.__self__, "__name__", name), True
    return name, False


def call_info(func) -> CallInfo:
    try:
        info = _cache.get(func)
    except TypeError:  # an unhashable callable: worked out every time
        return CallInfo(func)
    if info is not None:
        return info
    if type(func) is types.MethodWrapperType and func.__name__ == "__get__":
        # a property getter arrives as a fresh `descriptor.__get__` each time
        info = _getters.get(func.__self__)
        if info is None:
            info = _getters[func.__self__] = CallInfo(func)
        return info
    info = _cache[func] = CallInfo(func)
    return info


def node_target(info: CallInfo, args: tuple, kwargs: dict):
    """(op, target, args, kwargs) of the FX node for a recorded call."""
    order = info.order
    if order == "getter":
        return "call_function", getattr, (args[0], info.name), {}
    if order != "other" and not kwargs:
        if order == "binary" and len(args) == 2 or order == "unary" and len(args) == 1:
            return "call_function", info.target, args, {}
        if order == "reflected" and len(args) == 2:
            return "call_function", info.target, (args[1], args[0]), {}
    if info.method and args:
        return "call_method", info.name, args, kwargs
    return "call_function", info.func, args, kwargs


def _is_tensor_method(func, name: str) -> bool:
    for cls in (torch.Tensor, torch._C.TensorBase):
        if cls.__dict__.get(name) is func:
            return True
    qual = getattr(func, "__qualname__", "")
    return qual.startswith(("Tensor.", "TensorBase.", "_TensorBase."))


def _qualified(func) -> str:
    mod = getattr(func, "__module__", None) or ""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    if mod.startswith("torch._C._nn"):
        mod = "torch.nn.functional"
    return f"{mod}.{name}" if mod else name
