"""Format 1 (written by qkan-pack 0.1, superseded by format 2): inputs were passed to ``forward``
positionally in declared order, output containers were plain tuples/lists/dicts, and the
manifest carried a build timestamp."""

from __future__ import annotations

from typing import Any


def upgrade_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """A format-1 manifest as the current reader expects it (what v1 loads did, spelled out)."""
    upgraded = dict(raw)
    upgraded["call"] = "positional"
    upgraded.setdefault("reference_precision", "highest")  # v1 built on CPUs: full float32
    return upgraded
