"""Strict JSON: the one parser for manifests, safetensors headers, config values and
request bodies. Duplicate keys, NaN/Infinity literals, numbers that overflow to infinity
and strings holding a lone surrogate (``"\\ud800"``: valid JSON escapes, but no UTF-8 text;
RFC 7493 refuses them, as orjson and Rust's serde do) are refused, so what parses is what a
strict parser elsewhere reads too."""

from __future__ import annotations

import json
import math

from ..errors import ManifestError

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (docs/ARCHITECTURE.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_JSON_DEPTH = 64


def loads_strict(text: str | bytes) -> Any:
    """``json.loads`` that refuses duplicate keys, NaN/Infinity (also as ``1e999``), lone
    surrogates and nesting deeper than ``MAX_JSON_DEPTH``; every failure is a
    ManifestError."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicate_keys,
                           parse_constant=_no_constants, parse_float=_finite_float)
    except ManifestError:
        raise
    except (ValueError, TypeError, RecursionError) as exc:
        raise ManifestError(f"invalid JSON: {exc}") from None
    _check_tree(value)
    return value


def _check_tree(value: Any) -> None:
    """Refuse deep nesting iteratively, before any recursive consumer meets it, and text
    (keys too) that is not UTF-8."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ManifestError(f"JSON nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict):
            for key in item:
                _check_text(key)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def _check_text(text: str) -> None:
    surrogate = lone_surrogate(text)
    if surrogate is not None:
        raise ManifestError(f"JSON string {text[:40]!a} is not UTF-8 text: {surrogate}")


def lone_surrogate(text: str) -> str | None:
    """Where ``text`` holds a lone surrogate, which UTF-8 cannot encode, in words; None when
    it holds none."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = text[exc.start]
        origin = (f" (byte 0x{ord(char) - 0xDC00:02x} that is not UTF-8, as Python reads one in a "
                  "command-line argument or file name)" if 0xDC80 <= ord(char) <= 0xDCFF
                  else "")
        return (f"character {exc.start + 1} is {ascii(char)[1:-1]}, a lone surrogate"
                f"{origin}; write it in UTF-8")
    return None


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
