"""``qkan-pack serve``: an artifact over HTTP (and gRPC) on Ray Serve until Ctrl-C or SIGTERM.

``main`` runs the command as a supervisor and a child in a session of its own
(``qkan_pack/_session``); this module is the child's command.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from .._session import TOKEN_ENV
from ._app import cli
from ._options import device_option, load_compiled_option, load_precision_option, trusted_keys_option
from ._output import say
from ._token import read_token


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="HTTP bind address; loopback keeps the server private to this host "
              "(0.0.0.0 exposes it: use a token).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535),
              help="HTTP port. A taken port is an error: one server per port.")
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(min=1),
              help="Replicas, each loading its own predictor (at most 1000).")
@click.option("--gpus-per-replica", type=click.FloatRange(min=0),
              help="GPUs each replica reserves; fractions share a GPU (0.25: four per GPU) "
              "[default: up to 1 when the cluster has GPUs, else 0].")
@click.option("--cpus-per-replica", type=click.FloatRange(min=0),
              help="CPUs each replica reserves [default: what fits the cluster, at most 1].")
@click.option("--ingress", type=click.Choice(["auto", "haproxy", "python"]), default="auto",
              show_default=True, help="HTTP front: Ray Serve's HAProxy ingress (fast; auto "
              "uses it when its binary is installed) or its Python proxy.")
@click.option("--max-batch-size", type=click.IntRange(min=1),
              help="Rows gathered per replay, at most 65536 [default: the largest captured "
              "batch].")
@click.option("--max-batch-wait-ms", type=click.FloatRange(min=0),
              help="Every batch waits this long for more rows after its first (a fixed "
              "wait, as Ray's @serve.batch; at most 60000). [default: adaptive: a batch runs once rows stop "
              "arriving, at most 10 ms after its first; a lone row does not wait]")
@click.option("--exact", is_flag=True,
              help="Replay each row alone: bit-identical answers whatever else is in flight "
              "(batching changes the last bits, about 1e-7 relative).")
@click.option("--max-ongoing-requests", type=click.IntRange(min=1),
              help="Requests a replica works on at once [default: its batch size, at least 8].")
@click.option("--max-queued-requests", type=click.IntRange(min=0),
              help="Requests held waiting per replica (in HAProxy, the default ingress); beyond, "
              "a JSON 503 with Retry-After at once [default: half of --max-ongoing-requests].")
@click.option("--max-body-mb", default=8.0, show_default=True,
              type=click.FloatRange(min=0.001, max=65536.0),  # NaN is refused below
              help="Larger request bodies get HTTP 413 before they are read whole.")
@click.option("--body-timeout-s", default=30.0, show_default=True,
              type=click.FloatRange(min=0.1, max=86400.0),
              help="A request body not received within this time gets HTTP 408 (through HAProxy, "
              "the headers and the first 16 KiB of body within this or 10 s, whichever is shorter).")
@click.option("--auth-token-file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help=f"Require 'Authorization: Bearer <token>' on every route but the liveness "
              f"route GET /-/healthz (status only) [default: ${TOKEN_ENV}, else no token]. "
              "The token is the file's first line: at least 16 printable ASCII characters; "
              "the file must not be writable by its group or others (chmod 600).")
@trusted_keys_option("Refuse unless the artifact is signed by this public key or under this "
                     "root certificate (PEM): checked before Ray starts, and by each replica "
                     "before any artifact code runs. Repeatable.")
@click.option("--grace-s", default=10.0, show_default=True, type=click.FloatRange(min=0),
              help="On Ctrl-C or SIGTERM, how long in-flight requests may finish (at most "
              "3600).")
@device_option("Replica device: auto (cuda where Ray gave the replica a GPU), cpu or cuda.")
@click.option("--address", help="Ray cluster to join (e.g. auto), from its head node, where "
              "Serve's ingress runs (docs: cluster.md) [default: RAY_ADDRESS, else a local Ray "
              "started and stopped by this command].")
@load_precision_option("Replicas load at this precision (each gated on its device against "
                       "the artifact's max error) instead of the one it records for their "
                       "device.")
@load_compiled_option()
@click.option("--name", "model_name", metavar="NAME",
              help="The model's name in the Open Inference Protocol's URLs "
                   "(/v2/models/NAME) [default: the artifact's name].")
@click.option("--grpc-port", type=click.IntRange(1, 65535),
              help="Also serve the Open Inference Protocol over gRPC "
                   "(inference.GRPCInferenceService) on this port; needs tritonclient[grpc].")
@click.option("--verbose", is_flag=True, help="Show Ray's own log lines.")
@click.option("--noop", is_flag=True, hidden=True,
              help="Serve a fixed reply without the model (the load test's baseline).")
def serve(directory: Path, host: str, port: int, replicas: int, gpus_per_replica: float | None,
          cpus_per_replica: float | None, ingress: str, max_batch_size: int | None,
          max_batch_wait_ms: float | None, exact: bool, max_ongoing_requests: int | None,
          max_queued_requests: int | None, max_body_mb: float, body_timeout_s: float,
          auth_token_file: Path | None, keys: tuple[Path, ...], grace_s: float, device: str,
          address: str | None, precision: str, compiled: str, model_name: str | None,
          grpc_port: int | None,
          verbose: bool, noop: bool) -> None:
    """Serve DIRECTORY over HTTP on Ray Serve until Ctrl-C or SIGTERM (pip install
    'qkan-pack[serve]'). DIRECTORY is an artifact (manifest.json at its root) or a model
    repository laid out as Triton's, DIRECTORY/<name>/<version>/ (each version an artifact,
    each model's settings in DIRECTORY/<name>/qkan-pack.toml, the options below their
    defaults): each version its own deployment, POST /models/<name>[/versions/<v>] and
    /v2/models/<name>/... its routes, /v2/repository/... the repository's index, load and
    unload.

    Single rows from concurrent requests are batched into the captured shapes. GET /
    describes the artifact, POST / {"inputs": [[...]]} predicts, GET /stats counts replays,
    POST /stats/reset zeroes the counters; /v2/... is the Open Inference Protocol (KServe v2,
    Triton's API: tritonclient and KServe's clients work), over gRPC too with --grpc-port.
    Every reply is JSON, but GET /-/healthz (liveness, no token needed): its status only,
    200 or 503, with an empty body.
    """
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise click.ClickException("Ray Serve is not installed: pip install 'qkan-pack[serve]'")
    from ..serve import (
        HttpLimits,
        Listen,
        ReplicaLoad,
        ServeOptions,
        replica_device_text,
        serve_forever,
    )

    if address is None and device.startswith("cuda"):  # replicas run here: check it first
        from ..runtime import resolve_device

        resolve_device(device)  # the error verify gives in a second, before Ray starts
    token = read_token(auth_token_file, take=True)
    for hint, value in (("--max-body-mb", max_body_mb), ("--body-timeout-s", body_timeout_s),
                        ("--max-batch-wait-ms", max_batch_wait_ms), ("--grace-s", grace_s),
                        ("--gpus-per-replica", gpus_per_replica),
                        ("--cpus-per-replica", cpus_per_replica)):
        # click's FloatRange lets NaN through, and inf where it sets no maximum
        if value is not None and not math.isfinite(value):
            raise click.BadParameter("not a finite number", param_hint=hint)
    limits = HttpLimits(max_body_bytes=int(max_body_mb * 2**20), body_timeout_s=body_timeout_s,
                        max_ongoing=max_ongoing_requests, max_queued=max_queued_requests)
    options = ServeOptions(replicas=replicas, max_batch_size=max_batch_size,
                           max_batch_wait_ms=max_batch_wait_ms, exact=exact, device=device,
                           grace_s=grace_s, limits=limits, model_name=model_name)
    listen = Listen(host=host, port=port, address=address, ingress=ingress, verbose=verbose,
                    grpc_port=grpc_port)

    def ready(url: str, description: Mapping[str, Any]) -> None:
        if "models" in description:
            ready_repository(url, description)
            return
        what = "a no-op reply" if noop else f"{directory} ({description['digest']})"
        say(f"serving {what} at {url} with {replicas} replica(s) on "
             f"{replica_device_text(description['replica']['device'], replicas)}"
             + ("; bearer token required" if token else ""))
        if not noop:
            say(f"accepted: {'; '.join(description['accepted'])}")
            oip = description["oip"]
            grpc = f"; gRPC on port {grpc_port}" if grpc_port else ""
            say(f"Open Inference Protocol: {url}v2/models/{oip['model']} (version "
                 f"{oip['version']}){grpc}")
        click.echo("Ctrl-C or SIGTERM stops (drains for "
                   f"{grace_s:g} s)", err=True)

    def ready_repository(url: str, description: Mapping[str, Any]) -> None:
        models = description["models"]
        versions = sum(len(m["versions"]) for m in models)
        say(f"serving the model repository {directory} ({len(models)} model(s), {versions} "
            f"version(s)) at {url}" + ("; bearer token required" if token else ""))
        for model in models:
            numbers = ", ".join(v["version"] for v in model["versions"])
            say(f"  {model['name']}: versions {numbers} (default {model['default_version']}): "
                f"POST {url}models/{model['name']}, {url}v2/models/{model['name']}")
        say(f"repository: POST {url}v2/repository/index, .../models/<name>/load, /unload"
            + (f"; gRPC on port {grpc_port}" if grpc_port else ""))
        click.echo(f"Ctrl-C or SIGTERM stops (drains for {grace_s:g} s)", err=True)

    replica = ReplicaLoad(trusted_keys=keys, precision=precision, compiled=compiled,
                          cpus_per_replica=cpus_per_replica,
                          gpus_per_replica=gpus_per_replica, noop=noop)
    serve_forever(directory, options, listen, token=token, replica=replica, on_ready=ready,
                  notice=lambda line: click.echo(line, err=True))
    click.echo("stopped", err=True)
