"""How the input signatures an artifact accepts are written in messages: ``InputError``'s
text and the runtime's own listing of what a predictor takes. A leaf (standard library only)
that ``errors`` imports when it refuses a call, so ``import qkan_pack`` does not load it.
"""

from __future__ import annotations

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (docs/ARCHITECTURE.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any


def format_accepted(accepted: Sequence[Mapping[str, tuple[tuple[int, ...], str]]], *,
                    padded: bool = False) -> str:
    """Accepted signatures as one line: ``1x2 float32 | 64x2 float32`` (names shown when an
    artifact takes several inputs)."""
    def one(signature: Mapping[str, tuple[tuple[int, ...], str]]) -> str:
        parts = [f"{'x'.join(map(str, shape))} {dtype}" for shape, dtype in signature.values()]
        if len(signature) == 1:
            return parts[0]
        return ", ".join(f"{name}: {part}" for name, part in zip(signature, parts))

    text = " | ".join(one(signature) for signature in accepted)
    return text + (" (smaller batches padded)" if padded else "")


def format_ranges(ranges: Sequence[Mapping[str, Any]]) -> str:
    """Accepted ranges as one line: ``(1-8)x(1-128) int64`` per entry, an exact dimension as
    its size, inputs named when there are several, entries joined by ``|``."""
    def dims(spec: Mapping[str, Any]) -> str:
        return "x".join(str(hi) if lo == hi else f"({lo}-{hi})" for lo, hi in spec["dims"])

    def one(entry: Mapping[str, Any]) -> str:
        parts = [f"{dims(spec)} {spec['dtype']}" for spec in entry.values()]
        if len(entry) == 1:
            return parts[0]
        return ", ".join(f"{name} {part}" for name, part in zip(entry, parts))

    return " | ".join(one(entry) for entry in ranges)
