"""What one serving replica's HTTP handler costs per request, in process (no Ray, no network).

``ArtifactServer.__call__`` (admission, body read, parse, fit, route, row gathering, replay,
split, encode, reply) against ``NoopServer.__call__`` (read the body, return a fixed reply),
driven by N concurrent coroutines with in-memory starlette requests of one row each
(``{"inputs": [[...]]}``, the artifact's row shape). ``--stub`` replaces the replay with a
function returning zeros of the batch's shape, so the figure is everything but the model
(what a GPU replica's loop pays on top of a graph replay). Best of ``--repeats`` runs of
``--requests`` requests, after a warm-up; prints one line per client count and, with
``--json``, writes them. The whole replica's CPU per request under Ray and HAProxy is a
different measure (``benchmarks/results/2026-12-04_cpu_replica-cpu-per-request.md``).

    python benchmarks/serve_handler.py ARTIFACT --device cpu --stub --clients 1,32

Needs starlette (it comes with ``qkan-pack[serve]``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from starlette.requests import Request

from qkan_pack.serve import ArtifactServer, NoopServer, ServeOptions


def one_row_body(server: ArtifactServer) -> bytes:
    """A single-row request for the artifact's first (only) input, values in [-1, 1)."""
    description = server.describe()
    row = description["rows"][0]["row"]
    if len(row) != 1:
        raise SystemExit("this benchmark sends one input; the artifact takes "
                         f"{sorted(row)}")
    (shape,) = row.values()
    values = np.random.default_rng(0).uniform(-1, 1, (1, *shape)).astype(np.float32)
    return json.dumps({"inputs": values.tolist()}).encode()


def make_request(body: bytes) -> Request:
    """A POST / as Ray's replica hands it over: the whole body in one ASGI message."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/", "root_path": "", "query_string": b"",
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    return Request(scope, receive)


async def drive(server: Any, body: bytes, clients: int, total: int) -> float:
    """µs per request with ``clients`` requests in flight until ``total`` are answered."""
    done = 0

    async def client() -> None:
        nonlocal done
        while done < total:
            reply = await server(make_request(body))
            if reply.status_code != 200:
                raise SystemExit(f"the handler answered {reply.status_code}: {reply.body!r}")
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return (time.perf_counter() - started) / done * 1e6


def stub_replay(server: ArtifactServer) -> None:
    """Replace the model with zeros of each output's shape for the batch replayed."""
    import torch

    tail = next(iter(server.core.plan))
    probe = server.core.predictor(torch.zeros(1, *tail[0]))
    if not isinstance(probe, torch.Tensor):
        raise SystemExit("--stub replaces a model with one tensor output; this one returns "
                         f"{type(probe).__name__}")
    width = tuple(probe.shape[1:])

    class Zeros:
        device = torch.device("cpu")

        def __call__(self, x: Any) -> Any:
            return torch.zeros(x.shape[0], *width)

    server.core.predictor = Zeros()


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    server = ArtifactServer(str(args.artifact), options=ServeOptions(device=args.device))
    if args.stub:
        stub_replay(server)
    noop = NoopServer()
    body = one_row_body(server)
    rows = []
    for clients in args.clients:
        await drive(server, body, clients, args.requests // 8)
        await drive(noop, body, clients, args.requests // 8)
        model = min([await drive(server, body, clients, args.requests)
                     for _ in range(args.repeats)])
        baseline = min([await drive(noop, body, clients, args.requests)
                        for _ in range(args.repeats)])
        stats = server.core.stats.view(reset=True)
        rows.append({"clients": clients, "model_us": round(model, 2), "noop_us": round(baseline, 2),
                     "rows_per_replay": stats.get("rows_per_replay", {})})
        print(f"clients {clients:4d}: handler {model:7.1f} µs/request, no-op {baseline:6.1f} "
              f"µs/request ({'stub replay' if args.stub else args.device})", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--stub", action="store_true", help="replace the replay with zeros")
    parser.add_argument("--clients", type=lambda s: [int(c) for c in s.split(",")],
                        default=[1, 32])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    rows = asyncio.run(measure(args))
    if args.json:
        args.json.write_text(json.dumps({"artifact": str(args.artifact), "stub": args.stub,
                                         "device": args.device, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
