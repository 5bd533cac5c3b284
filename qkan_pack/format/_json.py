"""Strict JSON: the one parser for manifests, safetensors headers, config values and
request bodies. Duplicate keys, NaN/Infinity literals and numbers that overflow to
infinity are refused, so what parses is what a strict parser elsewhere reads too."""

from __future__ import annotations

import json
import math
from typing import Any

from ..errors import ManifestError

MAX_JSON_DEPTH = 64


def loads_strict(text: str | bytes) -> Any:
    """``json.loads`` that refuses duplicate keys, NaN/Infinity (also as ``1e999``) and
    nesting deeper than ``MAX_JSON_DEPTH``; every failure is a ManifestError."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicate_keys,
                           parse_constant=_no_constants, parse_float=_finite_float)
    except ManifestError:
        raise
    except (ValueError, TypeError, RecursionError) as exc:
        raise ManifestError(f"invalid JSON: {exc}") from None
    _check_depth(value)
    return value


def _check_depth(value: Any) -> None:
    """Refuse deep nesting iteratively, before any recursive consumer meets it."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ManifestError(f"JSON nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ManifestError(f"duplicate JSON key {key!r}")
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise ManifestError(f"JSON constant {name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ManifestError(f"JSON number {text[:40]} overflows to infinity")
    return value
