"""Bounded loopback load test of the Ray Serve deployment (``qkan-pack serve``).

    python benchmarks/serve_load.py                          # qkan_mlp 1x2,8x2,32x2, 32 clients, 20 s
    python benchmarks/serve_load.py --artifact DIR --clients 64 --seconds 30 --json out.json

Starts a local Ray and one replica on 127.0.0.1 only, then ``--clients`` threads each send
single-row POSTs back to back over a kept-alive connection for ``--seconds`` (after an untimed
warm-up). Reports requests/s, latency percentiles, errors, and from ``GET /stats`` how many
replays ran at each captured batch size and how many rows each replay packed.

``--baseline`` repeats the same load against the same artifact unbatched (``max_batch_size=1``)
and against a no-op Serve deployment that reads the body and returns a fixed row: the floor
Ray Serve's HTTP path sets on this host, whatever the model.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifact", type=Path, help="artifact directory [default: build "
                        "examples/qkan_mlp.py for --shapes into a temp dir]")
    parser.add_argument("--shapes", default="1x2,8x2,32x2", help="shapes when building")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0, help="untimed seconds of load first")
    parser.add_argument("--max-batch-wait-ms", type=float, default=2.0)
    parser.add_argument("--max-batch-size", type=int, default=None)
    parser.add_argument("--device", default="auto", help="replica device: auto, cpu or cuda")
    parser.add_argument("--baseline", action="store_true",
                        help="also run unbatched and a no-op Serve deployment under the same load")
    parser.add_argument("--json", type=Path, help="write the results here")
    return parser.parse_args(argv)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def client(port: int, width: int, seed: int, stop_at: float, out: list[tuple[float, bool]]
           ) -> None:
    """Single-row POSTs until ``stop_at``; append (latency s, ok) per request."""
    rng = np.random.default_rng(seed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    while time.perf_counter() < stop_at:
        body = json.dumps({"inputs": [rng.uniform(-1, 1, width).tolist()]})
        start = time.perf_counter()
        try:
            conn.request("POST", "/", body, headers)
            response = conn.getresponse()
            payload = response.read()
            ok = response.status == 200 and len(json.loads(payload)["outputs"]) == 1
        except (OSError, http.client.HTTPException, ValueError, KeyError):
            ok = False
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        out.append((time.perf_counter() - start, ok))
    conn.close()


def load(port: int, clients: int, seconds: float, width: int) -> list[tuple[float, bool]]:
    results: list[list[tuple[float, bool]]] = [[] for _ in range(clients)]
    stop_at = time.perf_counter() + seconds
    threads = [threading.Thread(target=client, args=(port, width, i, stop_at, results[i]))
               for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [r for per_client in results for r in per_client]


def get_json(port: int, path: str) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    payload = json.loads(conn.getresponse().read())
    conn.close()
    return payload


def summarise(samples: list[tuple[float, bool]], seconds: float) -> dict[str, Any]:
    latencies = sorted(t for t, ok in samples if ok)
    errors = sum(1 for _, ok in samples if not ok)

    def pct(q: float) -> float:
        return round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 3)

    return {
        "requests": len(samples), "ok": len(latencies), "errors": errors,
        "requests_per_s": round(len(latencies) / seconds, 1),
        "latency_ms": {"p50": pct(0.50), "p90": pct(0.90), "p99": pct(0.99),
                       "max": round(1000 * latencies[-1], 3),
                       "mean": round(1000 * statistics.fmean(latencies), 3)} if latencies else {},
    }


def render(report: dict[str, Any]) -> str:
    cfg, stats = report["config"], report["replica_stats"]
    lines = [
        f"qkan-pack serve load test: {cfg['clients']} clients x {cfg['seconds']:.0f} s, "
        f"1 replica on {report['replica']['device']}, batch wait {cfg['max_batch_wait_ms']} ms, "
        f"shapes {', '.join(report['artifact']['shapes'])}",
        f"{'run':<28}{'requests/s':>11}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'requests':>10}{'errors':>8}",
    ]
    for name, res in report["runs"].items():
        lat = res["latency_ms"]
        lines.append(f"{name:<28}{res['requests_per_s']:>11.1f}{lat.get('p50', 0):>9.1f}"
                     f"{lat.get('p90', 0):>9.1f}{lat.get('p99', 0):>9.1f}{lat.get('max', 0):>9.1f}"
                     f"{res['requests']:>10}{res['errors']:>8}")
    lines += ["", "batched run, replays per captured shape and rows packed per replay:"]
    lines += [f"  {label:<10}{count:>8} replays" for label, count in stats["replays"].items()]
    lines.append("  rows/replay " + ", ".join(f"{rows}:{count}" for rows, count
                                              in stats["rows_per_replay"].items()))
    lines.append(f"  mean rows per replay {report['mean_rows_per_replay']:.2f}; rows replayed "
                 f"{stats['rows_replayed']} (= {stats['requests']['rows']} row requests)")
    return "\n".join(lines)


class NoopBaseline:
    """Reads the body and returns one fixed row: Ray Serve's own HTTP cost."""

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import Response

        await request.body()
        return Response(b'{"outputs": [[0.0, 0.0]]}', media_type="application/json")


def measure(app: Any, port: int, args: argparse.Namespace, width: int
            ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None, float]:
    """Deploy ``app`` at /, warm up, run the load.

    Returns (summary, GET / reply, replica stats or None for the no-op, deploy seconds).
    """
    from ray import serve

    started = time.perf_counter()
    serve.run(app, name="load", route_prefix="/",
              logging_config={"enable_access_log": False, "log_level": "WARNING"})
    deploy_seconds = time.perf_counter() - started
    described = get_json(port, "/")
    is_artifact = "digest" in described
    load(port, args.clients, args.warmup, width)
    if is_artifact:
        get_json(port, "/stats?reset=1")
    samples = load(port, args.clients, args.seconds, width)
    stats = get_json(port, "/stats") if is_artifact else None
    serve.delete("load")
    return summarise(samples, args.seconds), described, stats, deploy_seconds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import ray
    import torch
    from ray import serve

    from qkan_pack import build, read_artifact
    from qkan_pack.serve import build_app

    runs: dict[str, Any] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.artifact
        if path is None:
            path = Path(tmp) / "qkan_mlp"
            build(ROOT / "examples" / "qkan_mlp.py", args.shapes, output=path)
        artifact = read_artifact(path)
        width = artifact.manifest.shapes[0].inputs[0][1][-1]
        port = free_port()
        ray.init(include_dashboard=False, logging_level="WARNING", log_to_driver=False)
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            app = build_app(path, device=args.device, max_batch_size=args.max_batch_size,
                            max_batch_wait_ms=args.max_batch_wait_ms)
            runs["batched"], described, stats, deploy_seconds = measure(app, port, args, width)
            if args.baseline:
                unbatched = build_app(path, device=args.device, max_batch_size=1,
                                      max_batch_wait_ms=0)
                runs["unbatched (max_batch_size=1)"] = measure(unbatched, port, args, width)[0]
                noop = serve.deployment(NoopBaseline, max_ongoing_requests=64).bind()
                runs["no-op Serve deployment"] = measure(noop, port, args, width)[0]
        finally:
            serve.shutdown()
            ray.shutdown()
    assert stats is not None
    replays = sum(stats["replays"].values())
    report = {
        "benchmark": "serve_load",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/serve_load.py " + " ".join(argv or sys.argv[1:]),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(),
                 "python": platform.python_version(), "torch": torch.__version__,
                 "ray": ray.__version__, "network": "loopback (127.0.0.1)",
                 "loadavg_1_5_15_before": [round(x, 2) for x in load_before],
                 "loadavg_1_5_15_after": [round(x, 2) for x in os.getloadavg()]},
        "artifact": {"digest": artifact.digest,
                     "shapes": [e.label for e in artifact.manifest.shapes]},
        "config": {"clients": args.clients, "seconds": args.seconds, "warmup": args.warmup,
                   "replicas": 1, **described["serving"]},
        "replica": {k: described["replica"][k] for k in ("device", "load_to_ready_seconds")},
        "deploy_seconds": round(deploy_seconds, 3),
        "results": runs["batched"],
        "runs": runs,
        "replica_stats": stats,
        "mean_rows_per_replay": stats["rows_replayed"] / replays if replays else 0.0,
    }
    print(render(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
