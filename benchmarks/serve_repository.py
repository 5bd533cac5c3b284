"""A model repository's aggregate throughput against one model served alone (issue 43: a
repository of 10 artifacts on one host serving all ten concurrently at >= 0.9x the aggregate
req/s of one model alone).

Builds ``--models`` artifacts of one model file (``m1`` ... ``mN``, each its own name and
version 1, as a repository requires) into ``REPO/<name>/1/``, starts two servers side by
side, ``qkan-pack serve REPO/m1/1`` (one artifact) and ``qkan-pack serve REPO``, and
measures, back to back at each ``--clients`` count (the total over all models), for
``--rounds`` rounds:

1. ``alone``: the one artifact's JSON route ``POST /``;
2. ``all``: the repository, the clients spread evenly over every model
   (``POST /models/<name>``): its aggregate;
3. ``one``: the repository, every client on ``/models/m1``: one model through the
   repository's routing (what the routing itself costs).

With bench-serve's load generator (closed-loop keep-alive clients in ``--processes``
processes). The figures are medians over the rounds: ``all`` / ``alone`` at each count
(target >= 0.9), and ``one`` / ``alone`` (about 1: no hop through the router).

    python benchmarks/serve_repository.py examples/qkan_mlp.py 1x2,8x2,32x2 --models 10 \\
        --clients 32,128,512 --processes 8 --serve-args '--device cuda' --json out.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from qkan_pack.bench._load import LoadSpec, run_load
from qkan_pack.bench._serve_load import ServerProcess, row_inputs, sigterm_as_exit, summarise


def build_repository(model: str, shapes: str, count: int, root: Path) -> list[str]:
    """``count`` artifacts of ``model`` as ``root/m<i>/1`` (reused when there)."""
    from qkan_pack import build

    names = [f"m{i}" for i in range(1, count + 1)]
    for name in names:
        if not (root / name / "1" / "manifest.json").exists():
            build(model, shapes, output=root / name / "1", name=name, progress=False)
    return names


def measure(server: ServerProcess, rows: Any, clients: int, paths: tuple[str, ...],
            args: argparse.Namespace) -> dict[str, Any]:
    spec = LoadSpec(host="127.0.0.1", port=server.port, clients=clients, seconds=args.seconds,
                    warmup=args.warmup, rows=rows, paths=paths)
    point = summarise(clients, run_load(spec, args.processes), args.seconds)
    figures = {"clients": clients, "requests_per_s": point.requests_per_s,
               "p50_ms": point.p50_ms, "p99_ms": point.p99_ms, "statuses": point.statuses}
    print(f"  {clients:>4} clients over {len(paths) or 1} route(s): "
          f"{point.requests_per_s:>9.0f} req/s, p99 {point.p99_ms or 0:.2f} ms, "
          f"statuses {point.statuses}", file=sys.stderr, flush=True)
    return figures


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Both servers started, then ``--rounds`` rounds of alone, all and one at each client
    count, back to back (so that each pair meets the same host: on a shared host, a server
    measured minutes after the other meets other neighbours); each figure the median over
    the rounds."""
    import statistics

    names = build_repository(args.model, args.shapes, args.models, root)
    rows = row_inputs(str(root / names[0] / "1"))
    serve_args = shlex.split(args.serve_args)
    servers: dict[str, ServerProcess] = {}
    routes = {"alone": (), "all": tuple(f"/models/{name}" for name in names),
              "one": (f"/models/{names[0]}",)}
    points: dict[str, dict[int, list[dict[str, Any]]]] = {kind: {} for kind in routes}
    try:
        for name, target, port in (("alone", root / names[0] / "1", args.port),
                                   ("repository", root, args.port + 1)):
            print(f"== {name}: qkan-pack serve {target}", file=sys.stderr, flush=True)
            servers[name] = ServerProcess(str(target), serve_args, port, args.start_timeout_s)
        for round_ in range(args.rounds):
            print(f"== round {round_ + 1}", file=sys.stderr, flush=True)
            for clients in args.clients:
                for kind, paths in routes.items():
                    server = servers["alone" if kind == "alone" else "repository"]
                    points[kind].setdefault(clients, []).append(
                        measure(server, rows, clients, paths, args))
    finally:
        ready = {name: server.ready_line for name, server in servers.items()}
        for server in servers.values():
            server.stop()
    curves = {kind: [{"clients": n, "requests_per_s": statistics.median(
                          p["requests_per_s"] for p in runs),
                      "p99_ms": statistics.median(p["p99_ms"] or 0 for p in runs), "runs": runs}
                     for n, runs in by_clients.items()]
              for kind, by_clients in points.items()}
    return {"models": len(names), "model": args.model, "shapes": args.shapes,
            "serve_args": serve_args, "rounds": args.rounds, "ready": ready, "curves": curves,
            "ratios": {kind: {str(a["clients"]): round(p["requests_per_s"] / a["requests_per_s"], 3)
                              for p, a in zip(curves[kind], curves["alone"]) if a["requests_per_s"]}
                       for kind in ("all", "one")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the model file every artifact is built from")
    parser.add_argument("shapes", help="build's shapes (1x2,8x2,32x2)")
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--clients", type=lambda t: [int(c) for c in t.split(",")],
                        default=[32, 128, 512])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--serve-args", default="")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--start-timeout-s", type=float, default=600.0)
    parser.add_argument("--repo", type=Path, help="where the artifacts are built (kept)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    with sigterm_as_exit(), tempfile.TemporaryDirectory() as scratch:
        report = run(args, args.repo or Path(scratch) / "repo")
    for kind, label in (("all", f"all {report['models']} models"),
                        ("one", "one model through the repository")):
        for clients, ratio in report["ratios"][kind].items():
            target = " (target >= 0.9)" if kind == "all" else ""
            print(f"{label} at {clients} clients: {ratio:.2f}x one model alone{target}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
