"""Declarative JSON for frozen dataclasses: the one reader and writer of the manifest (and of
the precompiled plan).

A field declares, with ``json_field``, the JSON key that holds it, a *codec* for its value
(a type with its range, choices or pattern; a list, an object of values, a nested
dataclass; or a function for a rule that is not one of those), its default, and when the
writer leaves it out. ``read_object`` and ``write_object`` walk those declarations, so a key
is read and written by the same description and the two cannot drift apart.

The reader's rules, the same in every object:

- every refusal is a ``ManifestError`` whose ``where`` is the JSON path of the value that
  failed (``manifest.shapes[2].outputs.tensor.shape[1]``);
- a key that no field declares is refused: a format version defines its keys, and a newer
  producer's key comes with a newer version (docs/artifacts.md, "Unknown keys");
- a field declares the format version its key came with (``since``; none: the oldest
  version written). ``versioned_keys`` walks a JSON document by the same declarations and
  names every such key it holds: the manifest's reader refuses one its document's version
  does not define, and its writer writes the lowest version that holds them all;
- an absent key takes the field's default, and is refused where the field has none;
- a dataclass refusing its own values in ``__post_init__`` (a rule that holds for objects
  made in Python too) raises ``ManifestError`` with ``where`` relative to itself
  (``"noise"``); the reader puts the object's path in front.

Codecs are plain objects, not a library: the format layer stays import-light (``import
qkan_pack`` loads it) and torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping

from ..errors import ManifestError

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (docs/ARCHITECTURE.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn, TypeVar

    _T = TypeVar("_T")

_META = "qkan_pack.json"


def refuse(where: str, problem: str) -> NoReturn:
    """Raise the reader's refusal: ``problem`` at JSON path ``where``."""
    raise ManifestError(problem, where=where)


def key_path(where: str, key: Any) -> str:
    """``where.key`` for a plain ASCII name, else ``where['any key']``."""
    if isinstance(key, str) and key.isascii() and key.isidentifier() and len(key) <= 64:
        return f"{where}.{key}"
    return f"{where}[{key!r:.80}]"


def show(value: Any) -> str:
    """A value as a refusal quotes it: JSON spelling, control characters escaped, short (a
    long list or object by its kind)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) <= 60:
        return text
    if isinstance(value, (dict, list, tuple)):
        return "a JSON object" if isinstance(value, dict) else "a JSON list"
    return text[:59] + "…"


class Codec:
    """One JSON value's rule: ``read`` returns the Python value or refuses (``what`` says
    what was expected), ``write`` returns it as JSON data."""

    what = "a JSON value"

    def accepts(self, value: Any) -> bool:
        return True

    def read(self, value: Any, where: str) -> Any:
        if not self.accepts(value):
            refuse(where, f"must be {self.what}, got {show(value)}")
        return value

    def write(self, value: Any) -> Any:
        return value

    def versioned_keys(self, value: Any, where: str) -> Iterator[tuple[str, int]]:
        """The keys inside JSON ``value`` whose field declares a ``since`` version, as (JSON
        path, version), in document order. A value this codec would refuse is passed over
        (reading refuses it after)."""
        return iter(())


class Text(Codec):
    """A string; with ``valid`` (a pattern or a predicate), one that ``what`` describes."""

    def __init__(self, valid: re.Pattern[str] | Callable[[str], Any] | None = None,
                 what: str = "text") -> None:
        self.valid = valid.match if isinstance(valid, re.Pattern) else valid
        self.what = what

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and (self.valid is None or bool(self.valid(value)))

    def read(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            refuse(where, f"must be text, got {show(value)}")
        super().read(value, where)  # the pattern or predicate
        return value


class Choice(Codec):
    """One of a fixed set of strings."""

    def __init__(self, options: Any) -> None:
        self.options = tuple(options)
        self.what = f"one of {', '.join(self.options)}"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.options


class Boolean(Codec):
    what = "true or false"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)


class Number(Codec):
    """A finite number (an integer reads as a float; never a boolean), within ``low``..``high``
    when given."""

    noun = "number"

    def __init__(self, low: float | None = None, high: float | None = None) -> None:
        self.low, self.high = low, high
        article = "an" if self.noun[0] in "aeiou" else "a"
        self.what = (f"a non-negative {self.noun}" if low == 0 and high is None
                     else f"{article} {self.noun} in [{low}, {high}]" if low is not None
                     and high is not None
                     else f"{article} {self.noun} of at least {low}" if low is not None
                     else f"{article} {self.noun}")

    def accepts(self, value: Any) -> bool:
        return type(value) in (int, float) and finite(value) and self._within(value)

    def _within(self, value: Any) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def read(self, value: Any, where: str) -> float:
        return float(super().read(value, where))


class Integer(Number):
    """An integer of any size (never a boolean or a float), within ``low``..``high`` when
    given."""

    noun = "integer"

    def accepts(self, value: Any) -> bool:
        return type(value) is int and self._within(value)

    def read(self, value: Any, where: str) -> int:
        return int(Codec.read(self, value, where))  # an int already: int() keeps its value


def finite(value: int | float) -> bool:
    """Whether a JSON number is one a float holds: not NaN or infinite, nor an integer beyond
    float's range (``math.isfinite`` raises on those)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class Nullable(Codec):
    """``null`` (read as None) or what ``inner`` reads."""

    def __init__(self, inner: Codec) -> None:
        self.inner = inner
        self.what = f"{inner.what} or null"

    def accepts(self, value: Any) -> bool:
        return value is None or self.inner.accepts(value)

    def read(self, value: Any, where: str) -> Any:
        if value is None:
            return None
        if not isinstance(value, (list, dict)) and not self.inner.accepts(value):
            refuse(where, f"must be {self.what}, got {show(value)}")
        return self.inner.read(value, where)

    def write(self, value: Any) -> Any:
        return None if value is None else self.inner.write(value)

    def versioned_keys(self, value: Any, where: str) -> Iterator[tuple[str, int]]:
        return self.inner.versioned_keys(value, where) if value is not None else iter(())


class JsonObject(Codec):
    """Any JSON object, kept as parsed (a model's config, the producer's versions)."""

    what = "a JSON object"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def read(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            refuse(where, f"must be {self.what}, got {show(value)}")
        return value

    def write(self, value: Any) -> Any:
        return dict(value)


_OBJECT = JsonObject()


class ListOf(Codec):
    """A JSON list of ``item`` values, ``min_len``..``max_len`` long; read as a tuple. With
    ``unique`` (a function of an item, and what it is called), no two items may share it."""

    what = "a JSON list"

    def __init__(self, item: Codec, min_len: int = 0, max_len: int | None = None,
                 unique: tuple[Callable[[Any], Any], str] | None = None) -> None:
        self.item, self.min_len, self.max_len, self.unique = item, min_len, max_len, unique

    def accepts(self, value: Any) -> bool:
        return isinstance(value, list)

    def read(self, value: Any, where: str) -> tuple[Any, ...]:
        super().read(value, where)
        if len(value) < self.min_len or (self.max_len is not None and len(value) > self.max_len):
            bounds = (f"{self.min_len} to {self.max_len}" if self.max_len is not None
                      else f"{self.min_len} or more")
            refuse(where, f"must have {bounds} entries, got {len(value)}")
        items = tuple(self.item.read(item, f"{where}[{i}]") for i, item in enumerate(value))
        if self.unique is not None:
            key, what = self.unique
            first: dict[Any, int] = {}
            for index, item in enumerate(items):
                if first.setdefault(key(item), index) != index:
                    refuse(f"{where}[{index}]", f"repeats the {what} of {where}[{first[key(item)]}]")
        return items

    def write(self, value: Any) -> list[Any]:
        return [self.item.write(item) for item in value]

    def versioned_keys(self, value: Any, where: str) -> Iterator[tuple[str, int]]:
        for index, item in enumerate(value if isinstance(value, list) else ()):
            yield from self.item.versioned_keys(item, f"{where}[{index}]")


class MapOf(Codec):
    """A JSON object of ``value`` values, each key one that ``key`` accepts (any text when
    None). Read as a dict, or with ``pairs`` as a tuple of (key, value) in document order;
    written with keys sorted when ``sort``."""

    what = "a JSON object"

    def __init__(self, value: Codec, key: Codec | None = None, *, min_len: int = 0,
                 pairs: bool = False, sort: bool = False) -> None:
        self.value, self.key, self.min_len = value, key, min_len
        self.pairs, self.sort = pairs, sort

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def read(self, value: Any, where: str) -> Any:
        super().read(value, where)
        if len(value) < self.min_len:
            refuse(where, f"must have {self.min_len} or more keys, got {len(value)}")
        items = []
        for name, item in value.items():
            here = key_path(where, name)
            if self.key is not None and not self.key.accepts(name):
                refuse(here, f"is not a valid key here: keys must be {self.key.what}")
            items.append((name, self.value.read(item, here)))
        return tuple(items) if self.pairs else dict(items)

    def write(self, value: Any) -> dict[str, Any]:
        items = value.items() if isinstance(value, Mapping) else value
        return {name: self.value.write(item)
                for name, item in (sorted(items) if self.sort else items)}

    def versioned_keys(self, value: Any, where: str) -> Iterator[tuple[str, int]]:
        for name, item in (value.items() if isinstance(value, dict) else ()):
            yield from self.value.versioned_keys(item, key_path(where, name))


class Pair(Codec):
    """A two-item JSON list ``[first, second]``; read as a tuple."""

    def __init__(self, first: Codec, second: Codec) -> None:
        self.first, self.second = first, second
        self.what = f"a [{first.what}, {second.what}] pair"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, list) and len(value) == 2

    def read(self, value: Any, where: str) -> tuple[Any, Any]:
        super().read(value, where)
        return self.first.read(value[0], f"{where}[0]"), self.second.read(value[1], f"{where}[1]")

    def write(self, value: Any) -> list[Any]:
        return [self.first.write(value[0]), self.second.write(value[1])]

    def versioned_keys(self, value: Any, where: str) -> Iterator[tuple[str, int]]:
        if self.accepts(value):
            yield from self.first.versioned_keys(value[0], f"{where}[0]")
            yield from self.second.versioned_keys(value[1], f"{where}[1]")


class Nested(Codec):
    """A JSON object read into dataclass ``cls`` by its declared fields; ``check(obj,
    where)`` then applies the rules between fields that reading alone cannot (and may
    return a corrected object)."""

    what = "a JSON object"

    def __init__(self, cls: type, check: Callable[[Any, str], Any] | None = None) -> None:
        self.cls, self.check = cls, check

    def read(self, value: Any, where: str) -> Any:
        return read_object(self.cls, value, where, self.check)

    def write(self, value: Any) -> dict[str, Any]:
        return write_object(value)

    def versioned_keys(self, value: Any, where: str) -> Iterator[tuple[str, int]]:
        return versioned_keys(self.cls, value, where)


class Custom(Codec):
    """A value no combination above describes: ``read(value, where)`` and ``write(value)``
    (free-form data: it holds no declared field, so no versioned key)."""

    def __init__(self, read: Callable[[Any, str], Any], write: Callable[[Any], Any]) -> None:
        self._read, self._write = read, write

    def read(self, value: Any, where: str) -> Any:
        return self._read(value, where)

    def write(self, value: Any) -> Any:
        return self._write(value)


# ---------------------------------------------------------------------------
# Fields and the walkers
# ---------------------------------------------------------------------------

#: ``omit``: leave the key out when the field holds its default.
WHEN_DEFAULT = "default"


class _Slot:
    """One declared field as the walkers use it (a plain class: a dataclass here would add
    to the import time of ``import qkan_pack``)."""

    __slots__ = ("codec", "default", "field", "fills", "key", "omit", "required", "since")

    def __init__(self, field: str, key: str, codec: Codec, required: bool, default: Any,
                 omit: str | Callable[[Any], bool] | None, fills: tuple[str, ...],
                 since: int | None) -> None:
        self.field, self.key, self.codec, self.required = field, key, codec, required
        self.default, self.omit, self.fills, self.since = default, omit, fills, since


def json_field(codec: Codec, *, key: str | None = None, default: Any = dataclasses.MISSING,
               factory: Any = dataclasses.MISSING,
               omit: str | Callable[[Any], bool] | None = None, required: bool = False,
               fills: tuple[str, ...] = (), since: int | None = None) -> Any:
    """A dataclass field held by JSON key ``key`` (default: the field's name), read and
    written by ``codec``. Without ``default``/``factory`` the key must be present (and
    ``required`` demands it even where the dataclass has a default). ``omit``: when the
    writer leaves the key out (``WHEN_DEFAULT``, or a predicate on the object).
    ``fills``: the fields one key holds together (``range`` -> ``low``, ``high``).
    ``since``: the format version the key came with (``versioned_keys``); a key added to a
    format comes optional, with a ``since`` and an ``omit``, so that a document that does
    not use it keeps the older version."""
    required = required or (default is dataclasses.MISSING and factory is dataclasses.MISSING)
    return dataclasses.field(default=default, default_factory=factory, metadata={
        _META: (codec, key, required, omit, fills, since)})


_LAYOUTS: dict[type, tuple[_Slot, ...]] = {}


def _layout(cls: type) -> tuple[_Slot, ...]:
    """The declared fields of ``cls`` in JSON order (``cls._json_order``, a list of field
    names, where it differs from the dataclass's order)."""
    found = _LAYOUTS.get(cls)
    if found is None:
        slots = []
        for field in dataclasses.fields(cls):
            if _META not in field.metadata:
                continue
            codec, key, required, omit, fills, since = field.metadata[_META]
            default = (field.default_factory() if field.default_factory is not dataclasses.MISSING
                       else field.default)
            slots.append(_Slot(field.name, key or field.name, codec, required, default, omit,
                               fills, since))
        order = getattr(cls, "_json_order", None)
        if order:
            slots.sort(key=lambda slot: order.index(slot.field))
        _LAYOUTS[cls] = found = tuple(slots)
    return found


def read_object(cls: type[_T], value: Any, where: str,
                check: Callable[[_T, str], _T] | None = None) -> _T:
    """Dataclass ``cls`` from the JSON object ``value`` at path ``where``, by its declared
    fields; ``check`` as in ``Nested``. Refusals are ``ManifestError`` naming the path."""
    raw = _OBJECT.read(value, where)
    slots = _layout(cls)
    keys = [slot.key for slot in slots]
    for key in raw:
        if key not in keys:
            refuse(key_path(where, key), f"is not a key this format version defines here "
                                         f"(known: {', '.join(keys)})")
    values: dict[str, Any] = {}
    for slot in slots:
        here = key_path(where, slot.key)
        if slot.key not in raw:
            if slot.required:
                refuse(here, "is missing")
            continue
        got = slot.codec.read(raw[slot.key], here)
        values.update(zip(slot.fills, got) if slot.fills else ((slot.field, got),))
    try:
        obj = cls(**values)
    except ManifestError as exc:  # the dataclass's own rule, at a path relative to it
        raise ManifestError(exc.problem, where=_join(where, exc.where)) from None
    return check(obj, where) if check is not None else obj


def write_object(obj: Any) -> dict[str, Any]:
    """The JSON object of a dataclass with declared fields, keys in declared order."""
    data = {}
    for slot in _layout(type(obj)):
        if slot.fills:
            value: Any = tuple(getattr(obj, name) for name in slot.fills)
        else:
            value = getattr(obj, slot.field)
        if (slot.omit == WHEN_DEFAULT and value == slot.default) \
                or (callable(slot.omit) and slot.omit(obj)):
            continue
        data[slot.key] = slot.codec.write(value)
    return data


def versioned_keys(cls: type, value: Any, where: str) -> Iterator[tuple[str, int]]:
    """The keys of JSON object ``value`` (read as dataclass ``cls`` at path ``where``) and of
    the objects inside it whose field declares the format version it came with (``since``),
    as (JSON path, version), in document order: what a document must declare to hold them.
    Malformed parts are passed over, for the reader to refuse."""
    if not isinstance(value, dict):
        return
    for slot in _layout(cls):
        if slot.key in value:
            here = key_path(where, slot.key)
            if slot.since is not None:
                yield here, slot.since
            yield from slot.codec.versioned_keys(value[slot.key], here)


def _join(where: str, relative: str | None) -> str:
    if not relative:
        return where
    return where + relative if relative.startswith("[") else f"{where}.{relative}"
