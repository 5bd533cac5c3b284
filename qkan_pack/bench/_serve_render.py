"""``bench-serve``'s report as text and as JSON: a table row per point, the ratios to the
JSON route with their rounds' range, the kill's line; apart from the measuring
(``_serve_load``) and its figures (``_serve_results``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._cpus import split_text
from ._serve_results import Point, ServeLoadReport
from ._server_process import ROLES

#: The CPU columns (µs per request): the server's parts (``ROLES``), the load's clients.
CPU_COLUMNS = (*ROLES, "clients")
POINT_HEADER = (f"{'clients':>7} {'protocol':<10} {'req/s':>10} {'rows/s':>10} {'p50 ms':>9} "
                f"{'p99 ms':>9} {'rows/replay':>11} "
                + " ".join(f"{role + ' us':>11}" for role in CPU_COLUMNS) + "  errors")


def render_point(point: Point) -> str:
    rows = f"{point.rows_per_replay:.2f}" if point.rows_per_replay else "-"
    others = {k: v for k, v in point.statuses.items() if k != "200"}
    cpu = " ".join(f"{point.cpu_us_per_request[role]:>11.0f}"
                   if role in point.cpu_us_per_request else f"{'-':>11}" for role in CPU_COLUMNS)
    return (f"{point.clients:>7} {point.protocol:<10} {point.requests_per_s:>10.1f} "
            f"{point.rows_per_s:>10.1f} {point.p50_ms or 0:>9.2f} {point.p99_ms or 0:>9.2f} "
            f"{rows:>11} {cpu}  {others or ''}")


def render_serve_load(report: ServeLoadReport) -> str:
    where = report.machine.get("gpu") or report.machine["cpu"]
    settings = report.settings
    rounds = settings.get("rounds", 1)
    median = f" (median of {rounds} rounds)" if rounds > 1 else ""
    lines = [f"qkan-pack serve load: {report.artifact}, {settings['seconds']:g} s per point"
             f"{median}, {settings['processes']} client processes, "
             f"{settings['rows_per_request']} row(s) per request{split_text(settings)}; {where}"]
    for mode, points in report.curves.items():
        title = mode if mode == "model" else f"{mode} (the JSON route only)"
        lines += ["", f"{title}: {report.server[mode]['ready']}", POINT_HEADER]
        lines += [render_point(p) for p in points]
    if report.ratios:
        spread = " [lowest-highest round]" if report.ratio_ranges else ""
        lines += ["", f"req/s against the JSON route at the same clients (rows/s alike){spread}:"]
        lines += [f"  {protocol:<10} " + render_ratios(by_clients,
                                                       report.ratio_ranges.get(protocol, {}))
                  for protocol, by_clients in report.ratios.items()]
    if report.kill:
        lines += ["", render_kill(report.kill, report.settings["kill_clients"])]
    if report.large_bodies:
        lb = report.large_bodies
        lines += ["", f"single-row p99 at {lb['clients']} clients: {lb['alone']['p99_ms']} ms alone, "
                  f"{lb['during']['p99_ms']} ms while {lb['body_mb']:g} MB bodies arrive "
                  f"({lb['large']['ok']} large bodies answered: {_statuses(lb['large'])})"]
    return "\n".join(lines)


def render_ratios(ratios: Mapping[str, float], ranges: Mapping[str, Sequence[float]]) -> str:
    """``0.97x at 8 [0.81-1.45], ...``: each client count's ratio, and its rounds' range
    where there is one."""
    return ", ".join(f"{ratio:.2f}x at {clients}" + (
        f" [{ranges[clients][0]:.2f}-{ranges[clients][1]:.2f}]" if clients in ranges else "")
        for clients, ratio in ratios.items())


def render_kill(kill: dict[str, Any], clients: int) -> str:
    """One line: how many kills, how many requests failed of how many, and how."""
    times = "" if kill.get("kills", 1) == 1 else f" {kill['kills']} times, every {kill['kill_every_s']:g} s,"
    failures = {k: v for k, v in kill["point"]["statuses"].items() if k != "200"}
    how = f" ({', '.join(f'{v} x {k}' for k, v in failures.items())})" if failures else ""
    total = kill["point"]["ok"] + kill["failed"]
    return (f"SIGKILL of 1 of {kill['replicas_before']} replicas{times} under {clients} clients: "
            f"{kill['failed']} of {total:,} requests failed{how}; replicas after: "
            f"{kill['replicas_after']}")


def _statuses(point: dict[str, Any]) -> str:
    return ", ".join(f"{count} x {status}" for status, count in point["statuses"].items())


def write_serve_json(report: ServeLoadReport, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.as_dict(), indent=2, allow_nan=False) + "\n")
    return path
