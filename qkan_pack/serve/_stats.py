"""A replica's counters for ``GET /stats``: requests by kind, replays per captured shape and
rows packed per replay. Updated from the event loop and from replay threads, hence the lock;
reset only by an authorised ``POST /stats/reset``."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

REQUEST_KINDS = ("rows", "direct", "rejected", "overloaded", "unauthorized", "abandoned")


class ReplicaStats:
    """Counters since the replica started or was last reset."""

    def __init__(self, labels: Sequence[str]) -> None:
        self._labels = list(labels)
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._requests: Counter[str] = Counter()
        self._replays: Counter[str] = Counter()
        self._rows_per_replay: Counter[int] = Counter()
        self._direct: Counter[str] = Counter()
        self._since = time.time()

    def request(self, kind: str, shape: str | None = None) -> None:
        with self._lock:
            self._requests[kind] += 1
            if shape is not None:
                self._direct[shape] += 1

    def replay(self, label: str, rows: int) -> None:
        with self._lock:
            self._replays[label] += 1
            self._rows_per_replay[rows] += 1

    def view(self, *, reset: bool = False) -> dict[str, Any]:
        """A JSON-ready snapshot (``reset`` zeroes the counters after reading)."""
        with self._lock:
            rows = self._rows_per_replay
            snapshot = {
                "requests": {k: self._requests.get(k, 0) for k in REQUEST_KINDS},
                "replays": {label: self._replays.get(label, 0) for label in self._labels},
                "rows_per_replay": {str(k): v for k, v in sorted(rows.items())},
                "rows_replayed": sum(k * v for k, v in rows.items()),
                "direct_shapes": dict(self._direct),
                "seconds": round(time.time() - self._since, 3),
            }
            if reset:
                self._reset()
        return snapshot
