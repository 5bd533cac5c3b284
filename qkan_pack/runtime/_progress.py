"""Progress bars on stderr for long work (build, capture, benchmarks).

Shown when stderr is a terminal, or always with ``QKAN_PACK_PROGRESS=1``; never with
``QKAN_PACK_PROGRESS=0``. A caller can force either with ``enabled=True/False``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["progress_bar"]


T = TypeVar("T")


def progress_enabled(enabled: bool | None = None) -> bool:
    if enabled is not None:
        return enabled
    setting = os.environ.get("QKAN_PACK_PROGRESS")
    if setting in ("0", "1"):
        return setting == "1"
    return sys.stderr.isatty()


def progress_bar(items: Iterable[T], *, desc: str, total: int | None = None,
             enabled: bool | None = None) -> Iterator[T]:
    """Iterate with a tqdm bar on stderr when enabled; a plain iteration otherwise."""
    if not progress_enabled(enabled):
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=desc, total=total, file=sys.stderr, leave=True,
                    dynamic_ncols=True, unit="step")
