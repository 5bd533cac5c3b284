"""Model outputs as a structure (``OutputNode``) plus a flat list of tensor leaves, and the
torch side of the dtype table.

A forward may return a tensor, None, or tuples, lists, dicts -- including their subclasses
that models return (transformers' ``ModelOutput``, namedtuples, dataclasses) -- nested. The
manifest records the structure once (with each container's class); captured graphs and
reference files deal in flat tensor leaves. ``map_leaves`` / ``iter_leaves`` are the one
walker over such structures: flatten, unflatten and every per-leaf transformation elsewhere
(serve's encoding, numpy conversion) go through them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

import torch

from ..errors import ModelSourceError
from ..format import DTYPES, OutputClass, OutputNode, TensorSpec, check_dtype

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["describe_output", "dtype_name", "flatten", "leaf_names_of", "map_leaves",
           "resolve_output_classes", "torch_dtype"]


#: Resolved output classes, keyed by (module, qualname); None where unresolvable here.
ClassTable = Mapping[tuple[str, str], type | None]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a manifest dtype name (the names are torch's own)."""
    dtype: torch.dtype = getattr(torch, check_dtype(name))  # the names are torch's own
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """The manifest name of a torch dtype; refuse dtypes an artifact cannot hold."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ModelSourceError(
            f"dtype {dtype} is not supported in artifacts; use one of {', '.join(DTYPES)}"
        )
    return name


def _children(tree: Any) -> list[tuple[Any, Any]] | None:
    """(key, value) pairs of a container, or None for a leaf."""
    if isinstance(tree, dict):
        return list(tree.items())
    if isinstance(tree, (tuple, list)):
        return list(enumerate(tree))
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return [(f.name, getattr(tree, f.name)) for f in dataclasses.fields(tree)]
    return None


def iter_leaves(tree: Any) -> Iterator[Any]:
    """Leaves depth-first, in the order of ``OutputNode.leaves``; None is no leaf."""
    children = _children(tree)
    if children is None:
        if tree is not None:
            yield tree
        return
    for _, value in children:
        yield from iter_leaves(value)


def map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Apply ``fn`` to every leaf of nested containers; dicts (of any class) come back as
    plain dicts, namedtuples as namedtuples, tuples and lists as themselves; None stays."""
    if tree is None:
        return None
    if isinstance(tree, dict) or (dataclasses.is_dataclass(tree) and not isinstance(tree, type)):
        return {key: map_leaves(fn, value) for key, value in _children(tree) or []}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(map_leaves(fn, value) for value in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(map_leaves(fn, value) for value in tree)
    return fn(tree)


def describe_output(value: Any, where: str = "output") -> OutputNode:
    """The structure of a forward's return value; refuse leaves that are not tensors."""
    if isinstance(value, torch.Tensor):
        return OutputNode("tensor", tensor=TensorSpec(tuple(value.shape), dtype_name(value.dtype)))
    if value is None:
        return OutputNode("none")
    children = _children(value)
    if children is None:
        raise ModelSourceError(_not_a_tensor(value, where))
    if isinstance(value, dict) and not all(isinstance(k, str) for k in value):
        raise ModelSourceError(f"{where} is a dict with non-string keys; use string keys")
    items = tuple(describe_output(v, f"{where}.{k}" if isinstance(k, str) else f"{where}[{k}]")
                  for k, v in children)
    cls = _output_class(value)
    if isinstance(value, (tuple, list)) and (cls is None or cls.form == "namedtuple"):
        return OutputNode("list" if isinstance(value, list) else "tuple", items=items, cls=cls)
    return OutputNode("dict", items=items, keys=tuple(str(k) for k, _ in children), cls=cls)


def leaf_names_of(tree: Any) -> list[str]:
    """The names of a returned tree's leaves (tensors or host arrays), by the one naming rule
    (``OutputNode.leaf_names``): what a reply names outputs by when the entries of one
    artifact return different structures."""
    return list(_structure(tree).leaf_names())


def _structure(tree: Any) -> OutputNode:
    """``tree``'s containers as an ``OutputNode``, every leaf a placeholder tensor."""
    if tree is None:
        return OutputNode("none")
    children = _children(tree)
    if children is None:
        return OutputNode("tensor", tensor=TensorSpec((), "float32"))
    items = tuple(_structure(value) for _, value in children)
    if isinstance(tree, (tuple, list)):
        return OutputNode("list" if isinstance(tree, list) else "tuple", items=items)
    return OutputNode("dict", items=items, keys=tuple(str(key) for key, _ in children))


def _output_class(value: Any) -> OutputClass | None:
    """The class to record for a container: None for plain tuple/list/dict."""
    cls = type(value)
    if cls in (tuple, list, dict):
        return None
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        form = "namedtuple"
    elif isinstance(value, dict):
        form = "mapping"
    elif dataclasses.is_dataclass(value):
        form = "dataclass"
    else:  # a tuple or list subclass that is not a namedtuple: kept as its base
        return None
    return OutputClass(module=cls.__module__, qualname=cls.__qualname__, form=form)


def _not_a_tensor(value: Any, where: str) -> str:
    name = type(value).__name__
    if "cache" in name.lower():
        return (f"{where} is a {name}: forward returns its key/value cache, state carried between "
                "calls that a captured graph cannot keep. Turn it off, e.g. --config "
                "use_cache=false when the factory passes it to the model's config (transformers: "
                "build the config with use_cache=False), or wrap the model in a module whose "
                "forward returns only tensors")
    return (f"{where} is a {name}; forward must return tensors (or None), in tuples, lists, dicts, "
            "namedtuples or dataclasses (e.g. transformers' ModelOutput); wrap the model in a "
            "module whose forward returns only those")


def flatten(value: Any) -> list[torch.Tensor]:
    """Tensor leaves in the same depth-first order as ``OutputNode.leaves``."""
    leaves = list(iter_leaves(value))
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            raise ModelSourceError(_not_a_tensor(leaf, "an output"))
    return leaves


def resolve_output_classes(nodes: Sequence[OutputNode],
                           referenced_by_model: Callable[[], Mapping[str, ModuleType]]
                           ) -> tuple[dict[tuple[str, str], type | None], list[str]]:
    """Find every recorded output class among the modules already imported; accept it only
    when a module ``referenced_by_model()`` returns (``referenced_modules``: what the
    verified model source and its model refer to; asked only when the manifest records a
    class, so plain-tensor models pay nothing on the load path) defines it or holds it by
    name -- transformers' modeling files import their ``ModelOutput`` classes,
    torchvision's hold ``OrderedDict``. Import nothing
    and run no module's ``__getattr__``, so a manifest can name only a class the model's own
    code already made available. Returns the table and one sentence per class that could not
    be found (those outputs come back as plain containers)."""
    table: dict[tuple[str, str], type | None] = {}
    problems = []
    held: set[int] | None = None  # ids of every class the referenced namespaces hold
    referenced: Mapping[str, ModuleType] | None = None
    for node in nodes:
        for cls in _classes(node):
            key = (cls.module, cls.qualname)
            if key in table:
                continue
            if referenced is None:
                referenced = referenced_by_model()
            found = _lookup(cls, referenced)
            if found is not None and cls.module not in referenced:
                if held is None:
                    held = {id(v) for m in referenced.values() for v in vars(m).values()
                            if isinstance(v, type)}
                found = found if id(found) in held else None
            table[key] = found
            if found is None:
                problems.append(f"output class {cls.module}.{cls.qualname} is neither defined "
                                "nor imported by the model source or its model's modules: "
                                "outputs of that class come back as plain containers (import "
                                "it in the model file to keep it)")
    return table, problems


def _classes(node: OutputNode) -> Iterator[OutputClass]:
    if node.cls is not None:
        yield node.cls
    for item in node.items:
        yield from _classes(item)


def _lookup(cls: OutputClass, referenced: Mapping[str, ModuleType]) -> type | None:
    """The class by its defining module and qualified name, read from namespaces (``vars``)
    only: a lazy module's ``__getattr__`` would import whatever the manifest names."""
    found: Any = referenced.get(cls.module) or sys.modules.get(cls.module)
    for part in cls.qualname.split("."):
        namespace = vars(found) if isinstance(found, (ModuleType, type)) else {}
        found = namespace.get(part)
    if not (isinstance(found, type) and found.__module__ == cls.module
            and found.__qualname__ == cls.qualname):
        return None
    fits = {"mapping": issubclass(found, dict),
            "namedtuple": issubclass(found, tuple) and hasattr(found, "_fields"),
            "dataclass": dataclasses.is_dataclass(found)}[cls.form]
    return found if fits else None


def unflatten(node: OutputNode, leaves: Sequence[Any], classes: ClassTable | None = None) -> Any:
    """Rebuild the structure from leaves (tensors or numpy arrays), with recorded classes
    where ``classes`` resolves them."""
    return _rebuild(node, iter(leaves), classes or {})


def _rebuild(node: OutputNode, leaves: Iterator[Any], classes: ClassTable) -> Any:
    if node.kind == "tensor":
        return next(leaves)
    if node.kind == "none":
        return None
    cls = classes.get((node.cls.module, node.cls.qualname)) if node.cls is not None else None
    if node.kind == "dict":
        items = {key: _rebuild(item, leaves, classes) for key, item in zip(node.keys, node.items)}
        return _instance(cls, items) if cls is not None else items
    values = [_rebuild(item, leaves, classes) for item in node.items]
    if cls is not None:
        return cls(*values)
    return values if node.kind == "list" else tuple(values)


def _instance(cls: type, items: dict[str, Any]) -> Any:
    """A recorded keyed class from its fields. A dataclass's ``init=False`` fields are no
    constructor arguments: they are assigned afterwards, with the values the model's
    forward left in them (its ``__post_init__`` may have computed them)."""
    if not dataclasses.is_dataclass(cls):
        return cls(**items)
    init = {f.name for f in dataclasses.fields(cls) if f.init}
    made = cls(**{k: v for k, v in items.items() if k in init})
    for key, value in items.items():
        if key not in init:
            object.__setattr__(made, key, value)  # frozen dataclasses too
    return made
