"""What one serving replica's HTTP handler costs per request, in process (no Ray, no network).

``ArtifactServer.__call__`` (admission, body read, parse, fit, route, row gathering, replay,
split, encode, reply) against ``NoopServer.__call__`` (read the body, return a fixed reply),
driven by N concurrent coroutines with in-memory starlette requests of one row each, for each
``--protocol``: ``json`` (``POST /``, ``{"inputs": [[...]]}``), ``oip-binary`` (the Open
Inference Protocol's binary HTTP infer, binary output asked for) and ``oip-grpc`` (a gRPC
``ModelInfer`` framed as HAProxy passes it on: ``POST /inference.GRPCInferenceService/
ModelInfer``, ``application/grpc``, with the headers grpcio sends; needs tritonclient[grpc]).
Protocols alternate within each round, so that a drift of the machine touches them alike.
``--stub`` replaces the replay with a function returning zeros of the batch's shape, so the
figure is everything but the model (what a GPU replica's loop pays on top of a graph
replay). Best of ``--repeats`` runs of ``--requests`` requests, after a warm-up; prints one
line per client count and, with ``--json``, writes them. The whole replica's CPU per
request under Ray and HAProxy is a different measure
(``benchmarks/results/2026-12-04_cpu_replica-cpu-per-request.md``).

    python benchmarks/serve_handler.py ARTIFACT --device cpu --stub --clients 1,32 \
        --protocol json,oip-binary,oip-grpc [--profile oip-grpc]

Needs starlette (it comes with ``qkan-pack[serve]``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
from starlette.requests import Request

from qkan_pack.serve import ArtifactServer, NoopServer, ServeOptions

#: What grpcio sends with every call, beside the path and content type, as HAProxy passes it
#: on over HTTP/1.1 (the replica's handler reads them all).
GRPC_HEADERS = [(b"te", b"trailers"), (b"grpc-accept-encoding", b"identity,deflate,gzip"),
                (b"user-agent", b"grpc-python/1.76.0 grpc-c/51.0.0 (linux; chttp2)"),
                (b"grpc-timeout", b"59999977u"), (b"x-forwarded-for", b"127.0.0.1")]


def one_row(server: ArtifactServer) -> np.ndarray:
    """A single row for the artifact's first (only) input, values in [-1, 1)."""
    description = server.describe()
    row = description["rows"][0]["row"]
    if len(row) != 1:
        raise SystemExit("this benchmark sends one input; the artifact takes "
                         f"{sorted(row)}")
    (shape,) = row.values()
    return np.random.default_rng(0).uniform(-1, 1, (1, *shape)).astype(np.float32)


def requests_of(server: ArtifactServer, row: np.ndarray) -> dict[str, tuple[str, bytes, Any]]:
    """Each protocol's (path, body, headers) for ``row``."""
    (name,) = [t.name for t in server.oip.inputs]
    model = server.oip.name
    header = json.dumps({"inputs": [{"name": name, "shape": list(row.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": row.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    kinds: dict[str, Any] = {
        "json": ("/", json.dumps({"inputs": row.tolist()}).encode(),
                 [(b"content-type", b"application/json")]),
        "oip-binary": (f"/v2/models/{model}/infer", header + row.tobytes(),
                       [(b"content-type", b"application/octet-stream"),
                        (b"inference-header-content-length", str(len(header)).encode())]),
    }
    try:
        from tritonclient.grpc import service_pb2 as pb
    except (ImportError, RuntimeError):
        return kinds
    message = pb.ModelInferRequest(model_name=model, inputs=[pb.ModelInferRequest.InferInputTensor(
        name=name, datatype="FP32", shape=list(row.shape))], raw_input_contents=[row.tobytes()]
    ).SerializeToString()
    kinds["oip-grpc"] = ("/inference.GRPCInferenceService/ModelInfer",
                         struct.pack(">BI", 0, len(message)) + message,
                         [(b"content-type", b"application/grpc"), *GRPC_HEADERS])
    return kinds


def make_request(path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Request:
    """A POST as Ray's replica hands it over: the whole body in one ASGI message."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "query_string": b"",
             "headers": [(b"content-length", str(len(body)).encode()), *headers]}
    return Request(scope, receive)


async def drive(server: Any, kind: tuple[str, bytes, list[Any]], clients: int,
                total: int) -> float:
    """µs per request with ``clients`` requests in flight until ``total`` are answered."""
    done = 0

    async def client() -> None:
        nonlocal done
        while done < total:
            reply = await server(make_request(*kind))
            if reply.status_code != 200 or reply.headers.get("grpc-status", "0") != "0":
                raise SystemExit(f"the handler answered {reply.status_code} "
                                 f"{dict(reply.headers)}: {bytes(reply.body)[:200]!r}")
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
    server = ArtifactServer(str(args.artifact),
                            options=ServeOptions(device=args.device, grpc=True))
    if args.stub:
        stub_replay(server)
    noop = NoopServer()
    kinds = requests_of(server, one_row(server))
    missing = [p for p in args.protocol if p not in kinds]
    if missing:
        raise SystemExit(f"--protocol {','.join(missing)} needs tritonclient[grpc]")
    rows = []
    for clients in args.clients:
        for protocol in args.protocol:
            await drive(server, kinds[protocol], clients, args.requests // 8)
        await drive(noop, kinds["json"], clients, args.requests // 8)
        runs: dict[str, list[float]] = {p: [] for p in args.protocol}
        for _ in range(args.repeats):
            for protocol in args.protocol:
                runs[protocol].append(await drive(server, kinds[protocol], clients,
                                                  args.requests))
        baseline = min([await drive(noop, kinds["json"], clients, args.requests)
                        for _ in range(args.repeats)])
        stats = server.core.stats.view(reset=True)
        best = {p: round(min(us), 2) for p, us in runs.items()}
        rows.append({"clients": clients, "handler_us": best, "noop_us": round(baseline, 2),
                     "rows_per_replay": stats.get("rows_per_replay", {})})
        print(f"clients {clients:4d}: " + ", ".join(f"{p} {us:6.1f}" for p, us in best.items())
              + f" µs/request; no-op {baseline:5.1f} ({'stub replay' if args.stub else args.device})",
              flush=True)
    for protocol in args.profile:
        profile = cProfile.Profile()
        profile.enable()
        await drive(server, kinds[protocol], args.clients[-1], args.requests)
        profile.disable()
        print(f"== cProfile, {protocol}, {args.clients[-1]} clients, {args.requests} requests")
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--stub", action="store_true", help="replace the replay with zeros")
    parser.add_argument("--clients", type=lambda s: [int(c) for c in s.split(",")],
                        default=[1, 32])
    parser.add_argument("--protocol", type=lambda s: s.split(","), default=["json"])
    parser.add_argument("--profile", type=lambda s: s.split(","), default=[],
                        help="then profile these protocols (cProfile, at the last --clients)")
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
