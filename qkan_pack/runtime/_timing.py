"""The one call-latency loop the tools share: ``qkan-pack bench`` times its variants with it,
``qkan-pack warm --precision auto`` its candidate precisions. Nothing on the serving path
calls it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["latencies"]


def latencies(call: Callable[[], Any], count: int, sync: Callable[[], None]) -> list[float]:
    """Host call to result ready, one call at a time (seconds)."""
    clock = time.perf_counter
    times = []
    for _ in range(count):
        started = clock()
        call()
        sync()
        times.append(clock() - started)
    return times
