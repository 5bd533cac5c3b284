"""``qkan-pack bench-serve REPO``: a model repository's aggregate throughput against one of
its models served alone.

Two servers run side by side, started as a user starts them: ``qkan-pack serve REPO`` and
``qkan-pack serve REPO/<model>/<version>`` (the repository's first model, at the version a
request without one gets). At each client count (the total over all models), back to back
so that each comparison meets the same host, for ``rounds`` rounds:

- ``alone``: the one artifact's JSON route ``POST /``;
- ``all``: the repository, the clients spread evenly over every model
  (``POST /models/<name>``): its aggregate;
- ``one``: the repository, every client on the first model: what the repository's routing
  costs one model.

Each figure is the median over the rounds; the ratios are ``all`` and ``one`` over
``alone`` at the same client count. Every model must take the same inputs (the load
generator sends one kind of row to every route); a repository whose models differ is
refused before its rows are sent. Like the rest of ``bench``, it imports nothing of the
serve layer: the models and versions come from the repository server's ``GET /``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._ports import side_ports
from ..errors import BenchError
from ._cpus import split_text
from ._load import Rows
from ._serve_load import (
    ServeLoadSettings,
    host_info,
    measure_point,
    rounds_of,
    row_inputs,
    sigterm_as_exit,
)
from ._serve_render import POINT_HEADER, render_point, render_ratios
from ._serve_results import SERVE_SCHEMA, Point, ServeLoadReport, ratios_to
from ._server_process import ServerProcess

#: The curves of a repository's report, in the order they are measured at each count.
REPOSITORY_CURVES = ("alone", "all", "one")


def is_repository(path: str | Path) -> bool:
    """A directory without ``manifest.json`` at its root: ``serve`` reads it as a model
    repository (``REPO/<name>/<version>/``), and so does ``bench-serve``."""
    return Path(path).is_dir() and not (Path(path) / "manifest.json").exists()


def check_repository_settings(settings: ServeLoadSettings) -> None:
    """What a repository's measurement cannot do, refused before any server starts."""
    refused = [what for what, asked in (
        ("--protocol other than json", settings.protocols != ("json",)),
        ("--kill-at", settings.kill_at_s is not None),
        ("--large-body-mb", settings.large_body_mb is not None)) if asked]
    if refused:
        raise BenchError(f"a model repository is measured over the JSON route, its aggregate "
                         f"against one model alone; {', '.join(refused)} measure one artifact: "
                         f"give bench-serve REPO/<name>/<version> for those")


def run_repository_load(repository: str | Path, settings: ServeLoadSettings | None = None, *,
                        token: str | None = None) -> ServeLoadReport:
    """The repository's aggregate against its first model alone (module docstring);
    ``token`` as ``run_serve_load`` takes it."""
    settings = settings or ServeLoadSettings(noop=False)
    check_repository_settings(settings)
    root = str(repository)
    report = ServeLoadReport(
        schema=SERVE_SCHEMA, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        artifact=root, command=sys.argv, settings=asdict(settings), machine=host_info())
    servers: dict[str, ServerProcess] = {}
    with sigterm_as_exit():
        try:
            servers["repository"] = _start(root, settings, settings.port, token)
            models = _models(servers["repository"])
            first = models[0]
            alone = str(Path(root) / first["name"] / first["default_version"])
            rows = _common_rows(root, models, settings)
            port = side_ports(1, exclude={settings.port})[0]
            servers["alone"] = _start(alone, settings, port, token)
            report.repository = {"models": [m["name"] for m in models],
                                 "alone": f"{first['name']}/{first['default_version']}"}
            report.curves = _measure_rounds(servers, models, rows, settings)
        finally:
            for name, server in servers.items():
                report.server[name] = {"ready": server.ready_line, "command": server.command,
                                       "exit_code": server.stop()}
    report.ratios, report.ratio_ranges = repository_ratios(report.curves)
    return report


def _start(target: str, settings: ServeLoadSettings, port: int,
           token: str | None) -> ServerProcess:
    print(f"== qkan-pack serve {target}", file=sys.stderr, flush=True)
    return ServerProcess(target, settings.serve_args, port, settings.start_timeout_s, token,
                         cpus=settings.server_cpus)


def _models(server: ServerProcess) -> list[dict[str, Any]]:
    """The models the repository serves, as its ``GET /`` lists them (at least one)."""
    models = server.get("/").get("models")
    if not isinstance(models, list) or not models:
        raise BenchError("the repository server's GET / lists no models; this qkan-pack serve "
                         "does not serve model repositories")
    return sorted(models, key=lambda model: model["name"])


def _common_rows(root: str, models: Sequence[dict[str, Any]],
                 settings: ServeLoadSettings) -> Rows:
    """The rows every model takes (each model's default version read as an artifact); a
    model whose inputs differ from the first one's is refused, named."""
    first, *others = (
        (model["name"], row_inputs(str(Path(root) / model["name"] / model["default_version"]),
                                   settings.lengths, settings.rows_per_request))
        for model in models)
    differ = [name for name, rows in others if rows != first[1]]
    if differ:
        raise BenchError(f"models {differ} take other inputs than {first[0]}: the load "
                         f"generator sends one kind of row to every model; measure a "
                         f"repository of models with the same inputs")
    return first[1]


def _measure_rounds(servers: dict[str, ServerProcess], models: Sequence[dict[str, Any]],
                    rows: Rows, settings: ServeLoadSettings) -> dict[str, list[Point]]:
    """Every round: at each client count, alone, all and one back to back; then each
    point the median of its rounds."""
    routes = {"alone": (servers["alone"], ()),
              "all": (servers["repository"], tuple(f"/models/{m['name']}" for m in models)),
              "one": (servers["repository"], (f"/models/{models[0]['name']}",))}
    return rounds_of(settings, REPOSITORY_CURVES, lambda clients, kind: measure_point(
        routes[kind][0], rows, clients, settings, True, paths=routes[kind][1]), alternate=False)


def repository_ratios(curves: dict[str, list[Point]]
                      ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, list[float]]]]:
    """(ratios, their per-round ranges): ``all`` and ``one`` req/s over ``alone``'s at the
    same client count."""
    alone = {p.clients: p for p in curves.get("alone", [])}
    ratios: dict[str, dict[str, float]] = {}
    ranges: dict[str, dict[str, list[float]]] = {}
    for kind in ("all", "one"):
        if kind in curves:
            ratios[kind], spread = ratios_to(curves[kind], alone)
            if spread:
                ranges[kind] = spread
    return ratios, ranges


def render_repository_load(report: ServeLoadReport) -> str:
    """The three curves, what each one is, and the ratios to the model alone."""
    where = report.machine.get("gpu") or report.machine["cpu"]
    repository = report.repository or {}
    models, alone = repository.get("models", []), repository.get("alone", "?")
    settings = report.settings
    lines = [f"qkan-pack serve load: the model repository {report.artifact} ({len(models)} "
             f"models), {settings['seconds']:g} s per point, median of {settings['rounds']} "
             f"round(s), {settings['processes']} client processes{split_text(settings)}; {where}"]
    titles = {
        "alone": f"alone: {alone} served alone, POST /: "
                 f"{report.server.get('alone', {}).get('ready', '')}",
        "all": f"all: every model of the repository at once, the clients spread evenly over "
               f"POST /models/<name>: {report.server.get('repository', {}).get('ready', '')}",
        "one": f"one: {alone.split('/')[0]} through the repository, POST /models/"
               f"{alone.split('/')[0]}"}
    for kind, points in report.curves.items():
        lines += ["", titles.get(kind, kind), POINT_HEADER, *map(render_point, points)]
    if report.ratios:
        spread = " [lowest-highest round]" if report.ratio_ranges else ""
        lines += ["", f"req/s against {alone} alone at the same clients{spread}:"]
        lines += [f"  {kind:<4} " + render_ratios(by_clients, report.ratio_ranges.get(kind, {}))
                  for kind, by_clients in report.ratios.items()]
    return "\n".join(lines)
