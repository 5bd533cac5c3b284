"""A model repository's aggregate throughput against one model served alone (issue 43: a
repository of 10 artifacts on one host serving all ten concurrently at >= 0.9x the aggregate
req/s of one model alone).

Builds ``--models`` artifacts of one model file (``m1`` ... ``mN``, each its own name and
version 1, as a repository requires) into ``REPO/<name>/1/``, then, one server at a time:

1. ``alone``: ``qkan-pack serve REPO/m1/1``, one artifact, its JSON route ``POST /``;
2. ``all``: ``qkan-pack serve REPO``, the clients spread evenly over every model
   (``POST /models/<name>``): the repository's aggregate;
3. ``one``: the same server, every client on ``/models/m1``: one model through the
   repository's routing, against ``alone`` (what the routing itself costs).

Each at every ``--clients`` count (the total over all models), with bench-serve's load
generator (closed-loop keep-alive clients in ``--processes`` processes). The figure is
``all`` / ``alone`` at each count (target >= 0.9), and ``one`` / ``alone`` (about 1: no hop
through the router).

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
    names = build_repository(args.model, args.shapes, args.models, root)
    rows = row_inputs(str(root / names[0] / "1"))
    serve_args = shlex.split(args.serve_args)
    curves: dict[str, list[dict[str, Any]]] = {}
    ready: dict[str, str] = {}
    for run_name, target in (("alone", root / names[0] / "1"), ("repository", root)):
        print(f"== {run_name}: qkan-pack serve {target}", file=sys.stderr, flush=True)
        server = ServerProcess(str(target), serve_args, args.port, args.start_timeout_s)
        ready[run_name] = server.ready_line
        try:
            if run_name == "alone":
                curves["alone"] = [measure(server, rows, n, (), args) for n in args.clients]
                continue
            every = tuple(f"/models/{name}" for name in names)
            for n in args.clients:
                curves.setdefault("all", []).append(measure(server, rows, n, every, args))
                curves.setdefault("one", []).append(
                    measure(server, rows, n, (f"/models/{names[0]}",), args))
        finally:
            server.stop()
    return {"models": len(names), "model": args.model, "shapes": args.shapes,
            "serve_args": serve_args, "ready": ready, "curves": curves,
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
