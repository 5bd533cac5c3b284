"""A model's output structure as the manifest records it: each entry's tree of tensors
(shape and dtype), ``None`` and containers, the containers' recorded classes, the one
flattening rule that names the tensor leaves (``OutputNode.leaf_names``), and the codec
that reads and writes the tree (``OutputTree``: one key naming the node's kind).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from ..errors import ShapeSpecError
from ._constants import DTYPES, MAX_RANK
from ._grammar import IDENTIFIER, Shape, check_dtype, format_shape
from ._schema import (
    Choice,
    Codec,
    Integer,
    JsonObject,
    ListOf,
    MapOf,
    Text,
    json_field,
    key_path,
    read_object,
    refuse,
    show,
    versioned_keys,
    write_object,
)

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (docs/ARCHITECTURE.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

OUTPUT_KINDS = ("tensor", "tuple", "list", "dict", "none")
#: How a recorded output class is rebuilt from its items: ``mapping`` (a dict subclass such as
#: transformers' ModelOutput, ``cls(**items)``), ``dataclass`` (``cls(**fields)``),
#: ``namedtuple`` (``cls(*items)``).
OUTPUT_CLASS_FORMS = ("mapping", "dataclass", "namedtuple")
#: The deepest output structure a manifest may describe.
MAX_OUTPUT_DEPTH = 16
_OBJECT = JsonObject()


class DTypeName(Codec):
    """A dtype name (aliases such as ``float`` read as their canonical name)."""

    what = f"one of {', '.join(DTYPES)}"

    def accepts(self, value: Any) -> bool:
        try:
            check_dtype(value)
        except ShapeSpecError:
            return False
        return True

    def read(self, value: Any, where: str) -> str:
        return check_dtype(super().read(value, where))



DTYPE = DTypeName()


def _dotted(name: str) -> bool:
    return all(IDENTIFIER.match(part) for part in name.split("."))


@dataclass(frozen=True)
class TensorSpec:
    """One output tensor's shape and dtype, as the build recorded it."""

    shape: Shape = json_field(ListOf(Integer(0), max_len=MAX_RANK))
    dtype: str = json_field(DTYPE)

    @property
    def label(self) -> str:
        return f"{format_shape(self.shape)} {self.dtype}"


@dataclass(frozen=True)
class OutputClass:
    """The Python class an output container had at build (e.g. a transformers ModelOutput).

    Resolved at load only from modules the verified model source already imported; never
    imported by name from the manifest.
    """

    module: str = json_field(Text(_dotted, "a dotted Python name"))
    qualname: str = json_field(Text(_dotted, "a dotted Python name"))
    form: str = json_field(Choice(OUTPUT_CLASS_FORMS))

    @property
    def label(self) -> str:
        return self.qualname


@dataclass(frozen=True)
class OutputNode:
    """One node of a model's output structure: a tensor, None, a tuple/list or a dict,
    the containers optionally of a recorded class (``cls``). In JSON, an object with one key
    naming the kind (``{"tensor": {...}}``, ``{"tuple": [...]}``) and optionally ``class``
    (``OutputTree``)."""

    kind: str  # one of OUTPUT_KINDS
    tensor: TensorSpec | None = None
    items: tuple[OutputNode, ...] = ()
    keys: tuple[str, ...] = ()
    cls: OutputClass | None = None

    def leaves(self) -> Iterator[TensorSpec]:
        if self.kind == "tensor" and self.tensor is not None:
            yield self.tensor
        for item in self.items:
            yield from item.leaves()

    def leaf_names(self, prefix: str = "output") -> Iterator[str]:
        """Each tensor leaf's name, in ``leaves()`` order: ``output``, ``output[0].boxes``
        (keys joined with ``.``, indices as ``[i]``): the one flattening rule, by which
        ``predict``'s files, ``GET /`` and the Open Inference Protocol name outputs."""
        return (name for name, _ in self._leaf_places(prefix, prefix))

    def _leaf_places(self, name: str, place: str) -> Iterator[tuple[str, str]]:
        """(name, place) per tensor leaf; the place spells every key (``output['a.b']``)."""
        if self.kind == "tensor" and self.tensor is not None:
            yield name, place
        for index, item in enumerate(self.items):
            if self.kind == "dict":
                key = self.keys[index]
                yield from item._leaf_places(f"{name}.{key}", f"{place}[{key!r}]")
            else:
                yield from item._leaf_places(f"{name}[{index}]", f"{place}[{index}]")

    def name_clashes(self) -> list[tuple[str, str, str]]:
        """Tensor leaves that ``leaf_names`` gives one name (a key holding the separator:
        ``{"a.b": y, "a": {"b": z}}``), as ``(name, first place, second place)``."""
        seen: dict[str, str] = {}
        clashes = []
        for name, place in self._leaf_places("output", "output"):
            if name in seen:
                clashes.append((name, seen[name], place))
            else:
                seen[name] = place
        return clashes

    @property
    def label(self) -> str:
        if self.kind == "tensor" and self.tensor is not None:
            return self.tensor.label
        if self.kind == "none":
            return "None"
        inner = ", ".join(
            f"{k}: {v.label}" if self.kind == "dict" else v.label
            for k, v in zip(self.keys or [""] * len(self.items), self.items)
        )
        text = {"tuple": f"({inner})", "list": f"[{inner}]", "dict": f"{{{inner}}}"}[self.kind]
        return f"{self.cls.label}{text}" if self.cls is not None else text


class OutputTree(Codec):
    """An ``OutputNode`` tree, at most ``MAX_OUTPUT_DEPTH`` levels below ``depth``."""

    def __init__(self, depth: int = 0) -> None:
        self.depth = depth

    def read(self, value: Any, where: str) -> OutputNode:
        if self.depth > MAX_OUTPUT_DEPTH:
            refuse(where, f"nests deeper than {MAX_OUTPUT_DEPTH} levels")
        raw = _OBJECT.read(value, where)
        kinds = [key for key in raw if key != "class"]
        if len(kinds) != 1:
            refuse(where, f"must have exactly one of {'/'.join(OUTPUT_KINDS)}, got {kinds}")
        kind, here = kinds[0], key_path(where, kinds[0])
        child = OutputTree(self.depth + 1)
        if kind == "tensor":
            node = OutputNode("tensor", tensor=read_object(TensorSpec, raw[kind], here))
        elif kind == "none":
            if raw[kind] is not None:
                refuse(here, f"must be null, got {show(raw[kind])}")
            node = OutputNode("none")
        elif kind in ("tuple", "list"):
            node = OutputNode(kind, items=ListOf(child).read(raw[kind], here))
        elif kind == "dict":
            pairs = MapOf(child, pairs=True).read(raw[kind], here)
            node = OutputNode("dict", items=tuple(v for _, v in pairs), keys=tuple(k for k, _ in pairs))
        else:
            refuse(here, f"is an unknown output kind: one of {'/'.join(OUTPUT_KINDS)} expected")
        if "class" not in raw:
            return node
        cls = read_object(OutputClass, raw["class"], key_path(where, "class"))
        if node.kind not in ("tuple", "dict") or (cls.form == "namedtuple") != (node.kind == "tuple"):
            refuse(f"{where}.class", f"{cls.form} does not fit a {node.kind} output")
        return replace(node, cls=cls)

    def write(self, node: OutputNode) -> dict[str, Any]:
        if node.kind == "tensor" and node.tensor is not None:
            return {"tensor": write_object(node.tensor)}
        if node.kind == "none":
            return {"none": None}
        if node.kind == "dict":
            data: dict[str, Any] = {"dict": {k: self.write(v) for k, v in zip(node.keys, node.items)}}
        else:
            data = {node.kind: [self.write(item) for item in node.items]}
        if node.cls is not None:
            data["class"] = write_object(node.cls)
        return data

    def versioned_keys(self, value: Any, where: str) -> Iterator[tuple[str, int]]:
        """The versioned keys of the tensor specs and classes in the tree (as ``read`` walks
        it; a tree too deep or of an unknown kind is left to ``read`` to refuse)."""
        if not isinstance(value, dict) or self.depth > MAX_OUTPUT_DEPTH:
            return
        child = OutputTree(self.depth + 1)
        for kind, inner in value.items():
            here = key_path(where, kind)
            if kind in ("tensor", "class"):
                yield from versioned_keys(TensorSpec if kind == "tensor" else OutputClass,
                                          inner, here)
            elif kind in ("tuple", "list"):
                yield from ListOf(child).versioned_keys(inner, here)
            elif kind == "dict":
                yield from MapOf(child).versioned_keys(inner, here)
