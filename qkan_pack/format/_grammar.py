"""The text users type: shapes (``8x128``), dtypes, ``KEY=VALUE`` config items.

Every parser returns a canonical value or raises ``ShapeSpecError`` saying what is wrong
and how to write it; no other exception escapes (the property tests hold us to it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..errors import ManifestError, ShapeSpecError
from ._constants import DTYPES, MAX_DIM, MAX_RANK, MAX_SHAPES, dtype_alias
from ._json import loads_strict

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

Shape = tuple[int, ...]


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


def parse_shapes(text: str) -> list[Shape]:
    """Parse ``"1x128,8x128"``: comma-separated shapes, all of one rank, no duplicates."""
    if not isinstance(text, str) or not text.strip():
        raise ShapeSpecError("--shapes is empty: give e.g. '1x128,8x128'")
    shapes = [parse_shape(item) for item in text.split(",")]
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
    if len(shapes) > 1 and all(len(s) == 1 for s in shapes):
        joined = "x".join(str(s[0]) for s in shapes)
        raise ShapeSpecError(
            f"{text!r} is ambiguous: it lists {len(shapes)} one-dimensional shapes. Dims are "
            f"joined by 'x' and shapes by ',': for one shape write {joined!r}. (Several 1-D "
            "shapes can be declared from Python: build(..., shapes=[(8,), (16,)]))")
    return shapes


def parse_input_option(text: str) -> tuple[str, list[Shape], str | None]:
    """Parse ``--input NAME:SHAPES[:DTYPE]`` (``input_ids:1x16,8x16:int64``)."""
    parts = text.split(":") if isinstance(text, str) else []
    if len(parts) not in (2, 3) or not IDENTIFIER.match(parts[0].strip()):
        raise ShapeSpecError(
            f"bad --input {text!r}: write NAME:SHAPES or NAME:SHAPES:DTYPE, e.g. "
            "input_ids:1x16,8x16:int64 (NAME is forward's parameter)")
    dtype = check_dtype(parts[2]) if len(parts) == 3 else None
    return parts[0].strip(), parse_shapes(parts[1]), dtype


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


def parse_config_items(items: Sequence[str]) -> dict[str, Any]:
    """Parse repeated ``KEY=VALUE``: VALUE as JSON when it parses, else the raw string."""
    config: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not IDENTIFIER.match(key):
            raise ShapeSpecError(
                f"bad --config {item!r}: write KEY=VALUE with KEY a Python identifier "
                "(VALUE is parsed as JSON, else kept as a string)"
            )
        if key in config:
            raise ShapeSpecError(f"--config key {key!r} is given twice")
        config[key] = _json_or_text(raw)
    return config


def _json_or_text(raw: str) -> Any:
    try:
        return loads_strict(raw)
    except ManifestError:
        return raw
