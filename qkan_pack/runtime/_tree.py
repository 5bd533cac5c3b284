"""Model outputs as a structure (``OutputNode``) plus a flat list of tensor leaves, and the
torch side of the dtype table.

A forward may return a tensor, a tuple/list, or a dict of them (nested); the manifest
records the structure once, captured graphs and reference files deal in flat leaves.
``map_leaves`` is the one walker over such structures: flatten, unflatten and every
per-leaf transformation elsewhere (serve's encoding, numpy conversion) go through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..errors import ModelSourceError
from ..format import DTYPES, OutputNode, TensorSpec, check_dtype


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a manifest dtype name (the names are torch's own)."""
    return getattr(torch, check_dtype(name))


def dtype_name(dtype: torch.dtype) -> str:
    """The manifest name of a torch dtype; refuse dtypes an artifact cannot hold."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ModelSourceError(
            f"dtype {dtype} is not supported in artifacts; use one of {', '.join(DTYPES)}"
        )
    return name


def map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Apply ``fn`` to every leaf of nested dicts/tuples/lists, keeping the containers."""
    if isinstance(tree, dict):
        return {key: map_leaves(fn, value) for key, value in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(map_leaves(fn, value) for value in tree)
    return fn(tree)


def iter_leaves(tree: Any) -> Iterator[Any]:
    """Leaves depth-first, in the order of ``OutputNode.leaves``."""
    if isinstance(tree, dict):
        for value in tree.values():
            yield from iter_leaves(value)
    elif isinstance(tree, (tuple, list)):
        for value in tree:
            yield from iter_leaves(value)
    else:
        yield tree


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
    leaves = list(iter_leaves(value))
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            raise ModelSourceError(f"forward returned a {type(leaf).__name__} inside its outputs")
    return leaves


def unflatten(node: OutputNode, leaves: Sequence[Any]) -> Any:
    """Rebuild the structure from leaves (tensors or numpy arrays)."""
    return _rebuild(node, iter(leaves))


def _rebuild(node: OutputNode, leaves: Iterator[Any]) -> Any:
    if node.kind == "tensor":
        return next(leaves)
    if node.kind == "dict":
        return {key: _rebuild(item, leaves) for key, item in zip(node.keys, node.items)}
    items = [_rebuild(item, leaves) for item in node.items]
    return items if node.kind == "list" else tuple(items)
