"""Model outputs as a structure (OutputNode) plus a flat list of tensor leaves.

A forward may return a tensor, a tuple/list, or a dict of them (nested); the manifest
records the structure once, captured graphs and reference files deal in flat leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .errors import ModelSourceError
from .spec import OutputNode, TensorSpec, check_dtype

DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
}
TORCH_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[check_dtype(name)]


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise ModelSourceError(
            f"dtype {dtype} is not supported in artifacts; use one of {', '.join(TORCH_DTYPES)}"
        ) from None


def describe_output(value: Any, where: str = "output") -> OutputNode:
    """The structure of a forward's return value; refuse anything but tensors in containers."""
    if isinstance(value, torch.Tensor):
        return OutputNode("tensor", tensor=TensorSpec(tuple(value.shape), dtype_name(value.dtype)))
    if isinstance(value, (tuple, list)):
        kind = "list" if isinstance(value, list) else "tuple"
        items = tuple(describe_output(v, f"{where}[{i}]") for i, v in enumerate(value))
        return OutputNode(kind, items=items)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ModelSourceError(f"{where} is a dict with non-string keys; use string keys")
        items = tuple(describe_output(v, f"{where}.{k}") for k, v in value.items())
        return OutputNode("dict", items=items, keys=tuple(value))
    raise ModelSourceError(
        f"{where} is a {type(value).__name__}; forward must return tensors, or tuples, "
        "lists or dicts of tensors"
    )


def flatten(value: Any) -> list[torch.Tensor]:
    """Tensor leaves in the same depth-first order as ``OutputNode.leaves``."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in flatten(v)]
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in flatten(v)]
    raise ModelSourceError(f"forward returned a {type(value).__name__} inside its outputs")


def unflatten(node: OutputNode, leaves: Sequence[Any]) -> Any:
    """Rebuild the structure from leaves (tensors or numpy arrays)."""
    iterator = iter(leaves)
    return _rebuild(node, iterator)


def _rebuild(node: OutputNode, leaves: Any) -> Any:
    if node.kind == "tensor":
        return next(leaves)
    if node.kind == "dict":
        return {key: _rebuild(item, leaves) for key, item in zip(node.keys, node.items)}
    items = [_rebuild(item, leaves) for item in node.items]
    return items if node.kind == "list" else tuple(items)
