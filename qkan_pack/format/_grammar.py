"""The text users type: shapes (``8x128``), dtypes, ``KEY=VALUE`` config items, devices.

Every parser returns a canonical value or raises ``ShapeSpecError`` saying what is wrong
and how to write it; no other exception escapes (the property tests hold us to it).
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Mapping, Sequence

from ..errors import DeviceError, ManifestError, ShapeSpecError
from ._constants import (
    DTYPES,
    MAX_DIM,
    MAX_RANK,
    MAX_REFERENCE_BYTES,
    MAX_SEED,
    MAX_SHAPES,
    dtype_alias,
)
from ._json import loads_strict

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (docs/ARCHITECTURE.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, overload

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

Shape = tuple[int, ...]
#: The device spellings qkan-pack takes (whether the device exists is the runtime's question).
DEVICE_TEXT = re.compile(r"(auto|(cpu|cuda)(:[0-9]+)?)\Z")  # ASCII digits: torch's


def check_device_text(device: str) -> None:
    """Refuse a device spelling qkan-pack cannot use, without importing torch: the serve
    launcher checks ``--device`` here before it starts Ray and replicas that would all fail."""
    if not DEVICE_TEXT.match(device):
        raise DeviceError(requested=device, problem="not a device qkan-pack can use; write "
                          "cpu, cuda, cuda:N or auto", usage=True)


def parse_shape(text: str) -> Shape:
    """Parse ``"8x128"`` into ``(8, 128)``: positive integers joined by ``x``."""
    if not isinstance(text, str):
        raise ShapeSpecError(f"a shape must be text like '8x128', got {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise ShapeSpecError("empty shape: write dimensions joined by 'x', e.g. '8x128'")
    parts = stripped.lower().split("x")
    if len(parts) > MAX_RANK:
        raise ShapeSpecError(f"shape {text!r} has {len(parts)} dims; at most {MAX_RANK} allowed")
    return tuple(_parse_dim(part, text) for part in parts)


def _parse_dim(part: str, text: str) -> int:
    part = part.strip()
    if not part.isascii() or not part.isdigit():
        raise ShapeSpecError(
            f"bad dimension {part!r} in shape {text!r}: each dimension must be a positive "
            "integer, dims joined by 'x' (e.g. '8x128')"
        )
    digits = part.lstrip("0") or "0"
    value = int(digits) if len(digits) <= len(str(MAX_DIM)) else MAX_DIM + 1  # no 4300-digit int()
    if value <= 0:
        raise ShapeSpecError(f"dimension {part!r} in shape {text!r} must be positive")
    if value > MAX_DIM:
        raise ShapeSpecError(f"dimension {part!r} in shape {text!r} exceeds {MAX_DIM}")
    return value


def parse_shapes(text: str, *, per_row: bool = False) -> list[Shape]:
    """Parse ``"1x128,8x128"``: comma-separated shapes, all of one rank, no duplicates.

    Several one-dimensional shapes (``1,3,32,32``) are refused as ambiguous (a shape with
    commas where ``x`` was meant), unless ``per_row``: with ``--batch-sizes`` they are
    per-row lengths (``--shapes 32,64,128 --batch-sizes 1,8``)."""
    if not isinstance(text, str) or not text.strip():
        raise ShapeSpecError("--shapes is empty: give e.g. '1x128,8x128'")
    shapes = [parse_shape(item) for item in text.split(",")]
    if not per_row and len(shapes) > 1 and all(len(s) == 1 for s in shapes):
        joined = "x".join(str(s[0]) for s in shapes)
        raise ShapeSpecError(
            f"{text!r} is ambiguous: it lists {len(shapes)} one-dimensional shapes. Dims are "
            f"joined by 'x' and shapes by ',': for one shape write {joined!r}. (Several 1-D "
            "shapes: per-row lengths with --batch-sizes, or from Python "
            "build(..., shapes=[(8,), (16,)]))")
    ranks = {len(s) for s in shapes}
    if len(ranks) > 1:
        raise ShapeSpecError(f"shapes {text!r} mix ranks {sorted(ranks)}: give one rank")
    seen: set[Shape] = set()
    for shape in shapes:
        if shape in seen:
            raise ShapeSpecError(f"shape {format_shape(shape)} is listed twice in {text!r}")
        seen.add(shape)
    if len(shapes) > MAX_SHAPES:
        raise ShapeSpecError(f"{len(shapes)} shapes given; at most {MAX_SHAPES} allowed")
    return shapes


def parse_input_option(text: str, *, per_row: bool = False) -> tuple[str, list[Shape], str | None]:
    """Parse ``--input NAME:SHAPES[:DTYPE]`` (``input_ids:1x16,8x16:int64``); ``per_row``:
    shapes without their batch dimension (``--batch-sizes``)."""
    parts = text.split(":") if isinstance(text, str) else []
    if len(parts) not in (2, 3) or not IDENTIFIER.match(parts[0].strip()):
        raise ShapeSpecError(
            f"bad --input {text!r}: write NAME:SHAPES or NAME:SHAPES:DTYPE, e.g. "
            "input_ids:1x16,8x16:int64 (NAME is forward's parameter)")
    dtype = check_dtype(parts[2]) if len(parts) == 3 else None
    return parts[0].strip(), parse_shapes(parts[1], per_row=per_row), dtype


def pair_inputs(declared: Sequence[tuple[str, list[Shape], str | None]]
                ) -> tuple[list[dict[str, Shape]], dict[str, str]]:
    """Several ``--input`` options as one ``{name: shape}`` per declared shape (paired by
    position) and ``{name: dtype}`` for those that gave one."""
    names = [name for name, _, _ in declared]
    if len(set(names)) != len(names):
        raise ShapeSpecError(f"--input names repeat: {names}")
    counts = {name: len(shapes) for name, shapes, _ in declared}
    if len(set(counts.values())) > 1:
        raise ShapeSpecError(
            "every --input must list the same number of shapes (they pair up by position): "
            + ", ".join(f"{n} has {c}" for n, c in counts.items()))
    per_shape = [{name: shapes[i] for name, shapes, _ in declared}
                 for i in range(next(iter(counts.values())))]
    return per_shape, {name: dtype for name, _, dtype in declared if dtype is not None}


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``1,8,32`` -> (1, 8, 32): distinct positive integers."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ShapeSpecError(f"batch sizes {text!r}: write positive integers joined by commas, "
                             "e.g. 1,8,32") from None
    return check_batch_sizes(sizes)


def check_batch_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    sizes = tuple(sizes)
    if not sizes or any(type(s) is not int or not 0 < s <= MAX_DIM for s in sizes):
        raise ShapeSpecError(f"batch sizes {list(sizes)}: give positive integers, e.g. 1,8,32")
    if len(set(sizes)) != len(sizes):
        raise ShapeSpecError(f"batch sizes {list(sizes)} repeat a size")
    return sizes


def with_batch_sizes(per_row: Sequence[Any], sizes: Sequence[int]) -> list[Any]:
    """Declared entries from per-row shapes and batch sizes: every per-row shape (one
    input's ``(128,)``, or named inputs' ``{name: (128,)}``) at every batch size, in that
    order: ``--shapes 128 --batch-sizes 1,8`` declares 1x128 and 8x128."""
    sizes = check_batch_sizes(sizes)
    expanded: list[Any] = []
    for row in per_row:
        for size in sizes:
            if isinstance(row, Mapping):
                expanded.append({name: _batched(shape, size) for name, shape in row.items()})
            else:
                expanded.append(_batched(row, size))
    return expanded


def _batched(shape: Sequence[int], size: int) -> Shape:
    if len(shape) + 1 > MAX_RANK:
        raise ShapeSpecError(f"per-row shape {format_shape(shape)} with a batch dimension "
                             f"has more than {MAX_RANK} dimensions")
    return (size, *shape)


def format_shape(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)


def check_dtype(name: str) -> str:
    """Return the canonical dtype name or raise listing the accepted ones."""
    if not isinstance(name, str):
        raise ShapeSpecError(f"a dtype must be text, got {type(name).__name__}")
    canonical = dtype_alias(name)
    if canonical not in DTYPES:
        raise ShapeSpecError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return canonical


#: Python's spellings of the JSON constants, as ``--config`` takes them: as text,
#: ``bias=False`` would be the truthy string "False" and build the opposite model.
_PYTHON_CONSTANTS = {"True": True, "False": False, "None": None}


def parse_config_items(items: Sequence[str]) -> dict[str, Any]:
    """Parse repeated ``KEY=VALUE``: VALUE as JSON when it parses (``True``, ``False`` and
    ``None`` too, as Python spells them), else the raw string (``'"False"'`` for that text)."""
    config: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not IDENTIFIER.match(key):
            raise ShapeSpecError(
                f"bad --config {item!r}: write KEY=VALUE with KEY a Python identifier "
                "(VALUE is parsed as JSON or True/False/None, else kept as a string)"
            )
        if key in config:
            raise ShapeSpecError(f"--config key {key!r} is given twice")
        config[key] = _json_or_text(key, raw)
    return check_config(config, "--config")


def _json_or_text(key: str, raw: str) -> Any:
    """JSON when it parses strictly; text that only starts like JSON (``[``, ``{``) and is
    refused (too deep, duplicate keys, NaN, malformed) is an error, never silently a string."""
    if raw.strip() in _PYTHON_CONSTANTS:
        return _PYTHON_CONSTANTS[raw.strip()]
    try:
        return loads_strict(raw)
    except ManifestError as exc:
        if raw.strip()[:1] in ("[", "{"):
            raise ShapeSpecError(
                f"--config {key}=… looks like JSON but is refused: {exc}; fix the value, or "
                "write it as a JSON string (\"...\") to pass text") from None
        return raw


def check_config(config: Any, where: str = "config") -> dict[str, Any]:
    """A factory config as the manifest records it: identifier keys and JSON values (finite
    numbers, text, booleans, null, lists, objects) nested at most as deep as the manifest
    reader accepts. Returned as a load will see it (tuples become lists), so the factory
    gets the same values at build and at load."""
    if not isinstance(config, Mapping):
        raise ShapeSpecError(f"{where} must map names to values, got {type(config).__name__}")
    for key in config:
        if not isinstance(key, str) or not IDENTIFIER.match(key):
            raise ShapeSpecError(f"{where} key {key!r:.40} is not a Python identifier")
    try:
        text = json.dumps(dict(config), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ShapeSpecError(
            f"{where} must hold JSON values (finite numbers, text, booleans, null, lists, "
            f"objects): {str(exc)[:120]}") from None
    try:
        checked: dict[str, Any] = loads_strict(text)  # a dict's JSON, read back
    except ManifestError as exc:
        raise ShapeSpecError(f"{where}: {exc}") from None
    return checked


def parse_range(text: str) -> tuple[float, float]:
    """``"0,256"`` -> ``(0.0, 256.0)``: two finite numbers, LOW below HIGH."""
    parts = text.split(",") if isinstance(text, str) else []
    try:
        low, high = (float(part) for part in parts)
    except ValueError:
        raise ShapeSpecError(f"input range {text!r:.40}: write LOW,HIGH, e.g. 0,256") from None
    return check_range((low, high))


if TYPE_CHECKING:
    @overload
    def check_range(value: None, dtypes: Sequence[str] = ()) -> None: ...
    @overload
    def check_range(value: Sequence[float], dtypes: Sequence[str] = ()) -> tuple[float, float]: ...
def check_range(value: Sequence[float] | None,
                dtypes: Sequence[str] = ()) -> tuple[float, float] | None:
    """A reference-input range: finite LOW below HIGH, inside what every float type of
    ``dtypes`` holds (float inputs are drawn uniformly from [LOW, HIGH)), holding an integer
    that fits every integer type (integer inputs are drawn from [int(LOW), int(HIGH)));
    None (no range given) stays None."""
    if value is None:
        return None
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError, OverflowError):
        raise ShapeSpecError(f"input range {value!r:.40} must be two numbers (LOW, HIGH)") from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ShapeSpecError(f"input range {low:g},{high:g}: LOW and HIGH must be finite")
    if not low < high:
        raise ShapeSpecError(f"input range {low:g},{high:g}: LOW must be below HIGH")
    for name in dict.fromkeys(check_dtype(d) for d in dtypes):
        largest = DTYPES[name].largest
        if largest is not None and max(-low, high) > largest:
            raise ShapeSpecError(f"input range {low:g},{high:g} does not fit {name} inputs "
                                 f"(they hold -{largest:g}..{largest:g})")
    integer = [d for d in dtypes if DTYPES[check_dtype(d)].kind == "int"]
    if integer and not int(low) < int(high):
        raise ShapeSpecError(f"input range {low:g},{high:g} holds no integer for {integer[0]} "
                             "inputs (they are drawn from [int(LOW), int(HIGH)))")
    for name in integer:
        smallest, largest = DTYPES[check_dtype(name)].int_limits or (0, 0)
        if int(low) < smallest or int(high) - 1 > largest:
            raise ShapeSpecError(f"input range {low:g},{high:g} does not fit {name} inputs "
                                 f"(they hold {smallest}..{largest}; integers are drawn from "
                                 "[int(LOW), int(HIGH)))")
    return low, high


def check_seed(seed: Any) -> int:
    """The seed of a build's reference inputs: an integer from 0 to ``MAX_SEED`` (the
    shape at index i draws with ``seed + i``, which ``torch.Generator`` takes below 2**64)."""
    if isinstance(seed, bool):
        raise ShapeSpecError(f"seed {seed!r} must be an integer, not a boolean")
    try:
        value = operator.index(seed)
    except TypeError:
        raise ShapeSpecError(f"seed {seed!r:.40} must be an integer from 0 to {MAX_SEED} "
                             "(2**63 - 1)") from None
    if not 0 <= value <= MAX_SEED:
        shown = str(value) if value.bit_length() <= 128 else f"a {value.bit_length()}-bit integer"
        raise ShapeSpecError(f"seed {shown} is outside 0..{MAX_SEED} (2**63 - 1)")
    return value


def check_reference_bytes(per_shape: Sequence[Mapping[str, Sequence[int]]],
                          dtypes: Mapping[str, str]) -> None:
    """Refuse, before anything is allocated, declared shapes whose reference inputs (every
    input of every shape, at its dtype's width) would exceed ``MAX_REFERENCE_BYTES``: the
    build holds them in memory, runs the model on them and writes them into the artifact.
    Counted with Python integers, so no size overflows on the way."""
    total = 0
    for shape_map in per_shape:
        size = sum(math.prod(shape) * DTYPES[check_dtype(dtypes[name])].itemsize
                   for name, shape in shape_map.items())
        total += size
        if total > MAX_REFERENCE_BYTES:
            label = ", ".join(f"{name} {format_shape(shape)} ({check_dtype(dtypes[name])})"
                              for name, shape in shape_map.items())
            before = f" after {_bytes(total - size)} for the shapes before it" \
                if total > size else ""
            raise ShapeSpecError(
                f"shape {label} needs {_bytes(size)} of reference inputs{before}; the declared "
                f"shapes together may use at most {_bytes(MAX_REFERENCE_BYTES)} "
                "(MAX_REFERENCE_BYTES): declare smaller shapes")


def _bytes(count: int) -> str:
    """``1.5 GiB``, ``8 GiB``, ``512 MiB``, ``120 B``: a size as people read it."""
    if count.bit_length() > 1000:  # beyond what a float can show
        return f"over 2**{count.bit_length() - 1} B"
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30),
                        ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.4g} {unit}"
    return f"{count} B"
