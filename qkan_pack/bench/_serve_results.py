"""``bench-serve``'s figures: a point per client count and protocol, the report that holds
them, and what is reduced from them (a point's median over rounds, ratios and their rounds'
range); apart from the measuring (``_serve_load``) and the rendering (``_serve_render``),
which both read them."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ._load import LoadResult

SERVE_SCHEMA = "qkan-pack/bench-serve/2"


@dataclass
class Point:
    """One client count in one protocol. ``statuses``: HTTP statuses, or for gRPC the
    status code's name, a success counted as 200."""

    clients: int
    requests_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    ok: int
    statuses: dict[str, int]
    rows_per_replay: float | None = None
    protocol: str = "json"
    rows_per_request: int = 1
    rows_per_s: float = 0.0
    #: CPU microseconds per request sent, over the whole run (warm-up included): the
    #: server's replicas, HAProxy and the rest of it (``_server_process.ROLES``), and the
    #: load's client processes ("clients"); where a request's time goes when req/s differ.
    cpu_us_per_request: dict[str, float] = field(default_factory=dict)
    #: Each round's req/s, in round order, where the point is the median of several
    #: (``median_point``): what a ratio's spread over the rounds is read from.
    round_requests_per_s: list[float] = field(default_factory=list)


@dataclass
class ServeLoadReport:
    schema: str
    created: str
    artifact: str
    command: list[str]
    settings: dict[str, Any]
    machine: dict[str, Any]
    server: dict[str, Any] = field(default_factory=dict)
    curves: dict[str, list[Point]] = field(default_factory=dict)
    #: protocol -> client count -> its req/s over the JSON route's (the model's curve).
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)
    #: protocol -> client count -> [lowest, highest] of that ratio round by round (each
    #: round measures both back to back), where there were several rounds.
    ratio_ranges: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    kill: dict[str, Any] | None = None
    large_bodies: dict[str, Any] | None = None
    #: A model repository's report (``_repo_load``): its models, and the one served alone.
    repository: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(sorted_ms: Sequence[float], q: float) -> float | None:
    if not sorted_ms:
        return None
    return round(sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))], 3)


def summarise(clients: int, result: LoadResult, seconds: float, protocol: str = "json",
              rows_per_request: int = 1) -> Point:
    latencies = sorted(result.latencies_ms)
    return Point(clients=clients, requests_per_s=round(len(latencies) / seconds, 1),
                 p50_ms=percentile(latencies, 0.50), p99_ms=percentile(latencies, 0.99),
                 ok=len(latencies), statuses={str(k): v for k, v in sorted(
                     result.statuses.items(), key=lambda kv: str(kv[0]))},
                 protocol=protocol, rows_per_request=rows_per_request,
                 rows_per_s=round(len(latencies) * rows_per_request / seconds, 1),
                 cpu_us_per_request={"clients": round(1e6 * result.cpu_s / result.sent, 1)}
                 if result.sent else {})


def median_point(points: Sequence[Point]) -> Point:
    """One point from the rounds' points at one client count: the median req/s, rows/s,
    latencies and rows per replay; the statuses summed (every error of every round shows)."""
    def median(values: Sequence[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return round(statistics.median(present), 3) if present else None

    statuses: dict[str, int] = {}
    for point in points:
        for status, count in point.statuses.items():
            statuses[status] = statuses.get(status, 0) + count
    roles = dict.fromkeys(role for p in points for role in p.cpu_us_per_request)
    cpu = {role: median([p.cpu_us_per_request.get(role) for p in points]) for role in roles}
    return replace(points[0], requests_per_s=median([p.requests_per_s for p in points]) or 0.0,
                   rows_per_s=median([p.rows_per_s for p in points]) or 0.0,
                   p50_ms=median([p.p50_ms for p in points]),
                   p99_ms=median([p.p99_ms for p in points]),
                   rows_per_replay=median([p.rows_per_replay for p in points]),
                   ok=sum(p.ok for p in points), statuses=statuses,
                   cpu_us_per_request={role: us for role, us in cpu.items() if us is not None},
                   round_requests_per_s=[p.requests_per_s for p in points]
                   if len(points) > 1 else [])


def round_ratio_range(point: Point, base: Point) -> list[float] | None:
    """[lowest, highest] of ``point``'s req/s over ``base``'s, round by round (``rounds_of``
    measures both in every round, back to back); None without several rounds of each. A
    median ratio alone hides how far single rounds disagree: on a busy host one round's
    ratio can sit 30% from the next one's."""
    rounds = list(zip(point.round_requests_per_s, base.round_requests_per_s))
    if len(rounds) < 2 or len(point.round_requests_per_s) != len(base.round_requests_per_s):
        return None
    ratios = [mine / theirs for mine, theirs in rounds if theirs]
    return [round(min(ratios), 2), round(max(ratios), 2)] if ratios else None


def ratios_to(points: Sequence[Point], base: Mapping[int, Point]
              ) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Each of ``points``' req/s over ``base``'s at its client count, keyed by client count
    (as text, JSON's keys), and where there were rounds the range of the per-round ratios."""
    ratios: dict[str, float] = {}
    ranges: dict[str, list[float]] = {}
    for point in points:
        other = base.get(point.clients)
        if other is None or not other.requests_per_s:
            continue
        ratios[str(point.clients)] = round(point.requests_per_s / other.requests_per_s, 2)
        if (spread := round_ratio_range(point, other)) is not None:
            ranges[str(point.clients)] = spread
    return ratios, ranges


def protocol_ratios(points: Sequence[Point]
                    ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, list[float]]]]:
    """(ratios, their per-round ranges): each other protocol's req/s over the JSON route's at
    the same client count (rows/s alike: every protocol sends the same rows per request)."""
    json_points = {p.clients: p for p in points if p.protocol == "json"}
    ratios: dict[str, dict[str, float]] = {}
    ranges: dict[str, dict[str, list[float]]] = {}
    for protocol in dict.fromkeys(p.protocol for p in points if p.protocol != "json"):
        mine, spread = ratios_to([p for p in points if p.protocol == protocol], json_points)
        if mine:
            ratios[protocol] = mine
        if spread:
            ranges[protocol] = spread
    return ratios, ranges
