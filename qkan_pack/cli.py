"""The ``qkan-pack`` command line: parse, call the library, map errors to one-line messages.

Exit codes: 0 success, 1 error (one line; ``QKAN_PACK_DEBUG=1`` shows the traceback),
2 usage error. Nothing here imports torch at module level so ``--help`` and ``inspect``
stay instant.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from ._version import __version__
from .bench import SKIPPABLE
from .errors import QkanPackError, ShapeSpecError
from .format import (
    CAPTURE_POLICIES,
    check_dtype,
    format_shape,
    manifest_to_dict,
    parse_config_items,
    parse_shapes,
)

DEBUG_ENV = "QKAN_PACK_DEBUG"


class _Group(click.Group):
    """Maps every library error to ``Error: <message>`` and exit 1 (the one mapping)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        except QkanPackError as exc:
            _fail(exc, known=True)
        except Exception as exc:
            _fail(exc, known=False)


def _fail(exc: BaseException, *, known: bool) -> None:
    if os.environ.get(DEBUG_ENV) == "1":
        raise exc
    message = " ".join(str(exc).split()) if known else f"unexpected {type(exc).__name__}: {exc}"
    click.echo(f"Error: {message}", err=True)
    if not known:
        click.echo(f"(set {DEBUG_ENV}=1 to see the traceback)", err=True)
    sys.exit(1)


def _usage(param: str, exc: ShapeSpecError) -> click.BadParameter:
    return click.BadParameter(str(exc), param_hint=param)


def _shapes_option(ctx: click.Context, param: click.Parameter, value: str) -> list:
    try:
        return parse_shapes(value)
    except ShapeSpecError as exc:
        raise _usage("--shapes", exc) from None


def _dtype_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return check_dtype(value)
    except ShapeSpecError as exc:
        raise _usage("--dtype", exc) from None


def _config_option(ctx: click.Context, param: click.Parameter, value: Sequence[str]) -> dict:
    try:
        return parse_config_items(value)
    except ShapeSpecError as exc:
        raise _usage(f"--{param.name}", exc) from None


def _range_option(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        low, high = (float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter("write LOW,HIGH, e.g. 0,256", param_hint="--input-range") from None
    if not low < high:
        raise click.BadParameter("LOW must be below HIGH", param_hint="--input-range")
    return (low, high)


def _list_option(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="qkan-pack")
def cli() -> None:
    """Package launch-bound PyTorch models into artifacts served by pre-captured CUDA graphs.

    \b
    qkan-pack build model.py --shapes 1x128,8x128      # write artifacts/model/
    qkan-pack inspect artifacts/model                  # manifest as a table
    qkan-pack verify artifacts/model --device cuda     # integrity, load, self-test
    """


@cli.command()
@click.argument("model_py", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--shapes", required=True, callback=_shapes_option,
              help="Comma-separated input shapes, dims joined by x: 1x128,8x128.")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
              help="Artifact directory [default: artifacts/<model file stem>].")
@click.option("--dtype", default="float32", show_default=True, callback=_dtype_option,
              help="Input dtype (int64 for token ids).")
@click.option("--entry", default="build_model", show_default=True,
              help="Factory in the model file: build_model(**config) -> nn.Module.")
@click.option("--config", "config", multiple=True, callback=_config_option, metavar="KEY=VALUE",
              help="Factory argument; VALUE parsed as JSON, else a string. Repeatable.")
@click.option("--weights", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="safetensors file or torch state dict (read with weights_only=True).")
@click.option("--include", multiple=True, type=click.Path(exists=True, path_type=Path),
              help="Extra local .py file or package directory the model imports. Repeatable.")
@click.option("--capture", type=click.Choice(CAPTURE_POLICIES), default="auto", show_default=True,
              help="Graph capture policy recorded for the GPU runtime.")
@click.option("--submodules", callback=_list_option, metavar="CLASS,...",
              help="Classes to capture under the submodules policy [default: qkan modules].")
@click.option("--input-range", callback=_range_option, metavar="LOW,HIGH",
              help="Range of reference inputs (uniform; ints in [LOW, HIGH)).")
@click.option("--seed", default=0, show_default=True, help="Seed of the reference inputs.")
@click.option("--force", is_flag=True, help="Replace an existing artifact at the output path.")
@click.option("--warm", "warm_device", is_flag=False, flag_value="cuda", default=None,
              metavar="[DEVICE]", help="Then ship compiled GPU kernels (needs a GPU here; "
              "DEVICE defaults to cuda). See `qkan-pack warm`.")
def build(model_py: Path, shapes: list, output: Path | None, dtype: str, entry: str,
          config: dict, weights: Path | None, include: tuple, capture: str, submodules: tuple,
          input_range: Any, seed: int, force: bool, warm_device: str | None) -> None:
    """Build an artifact from MODEL_PY for the declared input shapes."""
    from .builder import build as build_artifact

    result = build_artifact(model_py, shapes, output=output, dtype=dtype, entry=entry,
                            config=config, weights=weights, includes=include, capture=capture,
                            submodules=submodules, input_range=input_range, seed=seed,
                            force=force)
    shown = ", ".join(e.label for e in result.manifest.shapes)
    click.echo(f"built {result.path} ({shown}; {result.manifest.model.parameters:,} parameters)")
    if warm_device is not None:
        _warm(result.path, warm_device)
    else:
        click.echo(f"digest {result.digest}")


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--device", default="cuda", show_default=True, help="cuda or cuda:N.")
def warm(directory: Path, device: str) -> None:
    """Compile the GPU kernels DIRECTORY needs on this host's GPU and ship them inside it.

    A fresh GPU host then loads without compiling anything; one artifact can carry a
    kernel set per GPU architecture + toolchain (warm it once on each kind of host).
    """
    _warm(directory, device)


def _warm(directory: Path, device: str) -> None:
    from .builder import warm as warm_artifact

    click.echo(f"compiling kernels for {directory} on {device} (a fresh process, empty cache)…",
               err=True)
    result = warm_artifact(directory, device)
    click.echo(f"shipped {result.files} kernel files ({result.bytes / 2**20:.2f} MiB) as "
               f"{result.key} in {result.path}")
    click.echo(f"digest {result.digest}")


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect(directory: Path, as_json: bool) -> None:
    """Show an artifact's manifest as a table (checks integrity; runs no model code)."""
    from .runtime import read_artifact

    artifact = read_artifact(directory)
    if as_json:
        payload = {"digest": artifact.digest, "manifest": manifest_to_dict(artifact.manifest)}
        click.echo(json.dumps(payload, indent=2))
        return
    click.echo(render_manifest(artifact.manifest, artifact.digest, str(artifact.path)))


def render_manifest(manifest: Any, digest: str, path: str) -> str:
    """The manifest as a human-readable table."""
    model, producer = manifest.model, manifest.producer
    config = json.dumps(dict(model.config), sort_keys=True) if model.config else "{}"
    lines = [
        f"artifact   {path}",
        f"digest     {digest}   (integrity verified)",
        f"format     {manifest.format_name} v{manifest.format_version}, created {manifest.created}",
        f"model      {model.source} :: {model.entry}(**{config})",
        f"parameters {model.parameters:,}" + (f"   tied: {list(map(list, model.tied))}"
                                              if model.tied else ""),
        f"capture    {manifest.capture.policy}"
        + (f" ({', '.join(manifest.capture.submodules)})" if manifest.capture.submodules else ""),
        "producer   " + ", ".join(f"{k} {v}" for k, v in producer.items() if v),
        "inputs     " + ", ".join(f"{d.name}: {d.dtype}" for d in manifest.inputs),
        "",
        f"  {'#':>2}  {'inputs':<24}{'outputs':<40}",
    ]
    for index, entry in enumerate(manifest.shapes):
        inputs = ", ".join(f"{n} {format_shape(s)}" for n, s in entry.inputs)
        lines.append(f"  {index:>2}  {inputs:<24}{entry.outputs.label:<40}")
    lines += ["", f"  {'file':<44}{'bytes':>12}  sha256"]
    for name, entry in sorted(manifest.files.items()):
        lines.append(f"  {name:<44}{entry.size:>12,}  {entry.sha256[:16]}…")
    if manifest.kernels:
        lines += ["", "  shipped kernels:"]
        lines += [f"    {k.key}  ({k.directory})" for k in manifest.kernels]
    return "\n".join(lines)


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--expected-digest", help="Refuse unless the artifact digest is this sha256:…")
@click.option("--override", "overrides", multiple=True, callback=_config_option,
              metavar="KEY=VALUE", help="Override a factory argument at load. Repeatable.")
def verify(directory: Path, device: str, expected_digest: str | None, overrides: dict) -> None:
    """Check integrity, load on DEVICE and run the self-test; exit 0 only when sound."""
    from .runtime import Predictor

    with Predictor.load(directory, device=device, expected_digest=expected_digest,
                        config_overrides=overrides) as predictor:
        click.echo(str(predictor.report))
        click.echo(f"OK: {directory} is sound on {predictor.device}")


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--device", default="auto", show_default=True,
              help="cuda, cuda:N or cpu; auto picks cuda when available.")
@click.option("--iters", default=300, show_default=True, type=click.IntRange(min=1),
              help="Timed calls per variant per repeat.")
@click.option("--repeats", default=2, show_default=True, type=click.IntRange(min=1),
              help="Repeat the whole measurement; the spread between repeats shows the noise.")
@click.option("--warmup", default=20, show_default=True, type=click.IntRange(min=0),
              help="Untimed calls per variant before timing.")
@click.option("--skip", multiple=True, type=click.Choice(SKIPPABLE),
              help="Leave a variant out (e.g. torch_compile, whose warm-up takes long). Repeatable.")
@click.option("--override", "overrides", multiple=True, callback=_config_option,
              metavar="KEY=VALUE", help="Override a factory argument at load. Repeatable.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the full results as JSON here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG of latency per shape per variant here (needs matplotlib).")
@click.option("--cold-start", is_flag=True,
              help="Also time fresh processes from launch to their first served call.")
@click.option("--fresh-kernel-cache", is_flag=True,
              help="Give the cold-start processes empty Triton/Inductor caches (a new host).")
def bench(directory: Path, device: str, iters: int, repeats: int, warmup: int, skip: tuple,
          overrides: dict, json_path: Path | None, plot_path: Path | None, cold_start: bool,
          fresh_kernel_cache: bool) -> None:
    """Time eager PyTorch, the predictor and the alternatives on DIRECTORY, side by side."""
    from .bench import BenchSettings, render_table, run_bench, write_json, write_plot

    settings = BenchSettings(iters=iters, repeats=repeats, warmup=warmup, skip=tuple(skip),
                             config_overrides=overrides)
    report = run_bench(directory, device, settings=settings, cold_start=cold_start,
                       fresh_kernel_cache=fresh_kernel_cache)
    click.echo(render_table(report))
    if json_path is not None:
        click.echo(f"wrote {write_json(report, json_path)}")
    if plot_path is not None:
        click.echo(f"wrote {write_plot(report, plot_path)}")


def _clients_option(ctx: click.Context, param: click.Parameter, value: str) -> tuple:
    try:
        counts = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise click.BadParameter("write client counts as 1,8,32", param_hint="--clients")
    return counts


@cli.command("bench-serve")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--clients", default="1,8,32,128,512", show_default=True, callback=_clients_option,
              help="Concurrent clients per point, comma-separated.")
@click.option("--seconds", default=10.0, show_default=True, type=click.FloatRange(min=0.5),
              help="Timed seconds per point.")
@click.option("--warmup", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Untimed seconds of load before each point.")
@click.option("--processes", type=click.IntRange(min=1),
              help="Client processes (threads inside share the clients) [default: half the cores].")
@click.option("--serve-args", default="", metavar="'ARGS'",
              help="Options for `qkan-pack serve`, quoted: '--replicas 4 --gpus-per-replica 0.25'.")
@click.option("--no-noop", is_flag=True, help="Skip the no-op deployment baseline.")
@click.option("--kill-at", type=click.FloatRange(min=0), metavar="SECONDS",
              help="Also SIGKILL one replica this long into a run at --kill-clients clients.")
@click.option("--kill-clients", default=32, show_default=True, type=click.IntRange(min=1),
              help="Clients during the replica kill.")
@click.option("--large-body-mb", type=click.FloatRange(min=0.001),
              help="Also measure single-row latency while bodies of this size arrive.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535),
              help="Port the server under test listens on (loopback).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the results as JSON here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the curve as a PNG here (needs matplotlib).")
def bench_serve(directory: Path, clients: tuple, seconds: float, warmup: float,
                processes: int | None, serve_args: str, no_noop: bool, kill_at: float | None,
                kill_clients: int, large_body_mb: float | None, port: int,
                json_path: Path | None, plot_path: Path | None) -> None:
    """Load-test `qkan-pack serve DIRECTORY` (started here as a process) over loopback HTTP:
    req/s, p50, p99 and rows per replay for each client count, beside a no-op deployment."""
    import shlex

    from .bench import (
        ServeLoadSettings,
        render_serve_load,
        run_serve_load,
        write_serve_json,
        write_serve_plot,
    )

    extra = {"processes": processes} if processes else {}
    settings = ServeLoadSettings(clients=clients, seconds=seconds, warmup=warmup,
                                 serve_args=tuple(shlex.split(serve_args)), noop=not no_noop,
                                 kill_at_s=kill_at, kill_clients=kill_clients,
                                 large_body_mb=large_body_mb, port=port, **extra)
    report = run_serve_load(directory, settings)
    click.echo(render_serve_load(report))
    if json_path is not None:
        click.echo(f"wrote {write_serve_json(report, json_path)}")
    if plot_path is not None:
        click.echo(f"wrote {write_serve_plot(report, plot_path)}")


TOKEN_ENV = "QKAN_PACK_SERVE_TOKEN"


def _read_token(path: Path | None) -> str | None:
    """The bearer token from --auth-token-file (first line), else QKAN_PACK_SERVE_TOKEN."""
    token = path.read_text().strip() if path is not None else os.environ.get(TOKEN_ENV, "").strip()
    if path is not None and not token:
        raise click.BadParameter(f"{path} holds no token", param_hint="--auth-token-file")
    if token and (len(token) < 16 or any(c.isspace() for c in token)):
        raise click.BadParameter("a token needs at least 16 characters and no whitespace",
                                 param_hint="--auth-token-file" if path else TOKEN_ENV)
    return token or None


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="HTTP bind address; loopback keeps the server private to this host "
              "(0.0.0.0 exposes it: use a token).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535),
              help="HTTP port. A taken port is an error: one server per port.")
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(min=1),
              help="Replicas, each loading its own predictor.")
@click.option("--gpus-per-replica", type=click.FloatRange(min=0),
              help="GPUs each replica reserves; fractions share a GPU (0.25: four per GPU) "
              "[default: up to 1 when the cluster has GPUs, else 0].")
@click.option("--cpus-per-replica", type=click.FloatRange(min=0),
              help="CPUs each replica reserves [default: what fits the cluster, at most 1].")
@click.option("--ingress", type=click.Choice(["auto", "haproxy", "python"]), default="auto",
              show_default=True, help="HTTP front: Ray Serve's HAProxy ingress (fast; auto "
              "uses it when its binary is installed) or its Python proxy.")
@click.option("--max-batch-size", type=click.IntRange(min=1),
              help="Rows gathered per replay [default: the largest captured batch].")
@click.option("--max-batch-wait-ms", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Longest wait for more rows once one arrived.")
@click.option("--exact", is_flag=True,
              help="Replay each row alone: bit-identical answers whatever else is in flight "
              "(batching changes the last bits, about 1e-7 relative).")
@click.option("--max-ongoing-requests", default=64, show_default=True, type=click.IntRange(min=1),
              help="Requests a replica works on at once.")
@click.option("--max-queued-requests", default=64, show_default=True, type=click.IntRange(min=0),
              help="Requests a replica holds waiting; beyond, a JSON 503 with Retry-After at once.")
@click.option("--max-body-mb", default=8.0, show_default=True, type=click.FloatRange(min=0.001),
              help="Larger request bodies get HTTP 413 before they are read whole.")
@click.option("--body-timeout-s", default=30.0, show_default=True, type=click.FloatRange(min=0.1),
              help="A request body not received within this time gets HTTP 408.")
@click.option("--auth-token-file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help=f"Require 'Authorization: Bearer <token>' on every route (token: the file's "
              f"first line) [default: ${TOKEN_ENV}, else no token].")
@click.option("--grace-s", default=10.0, show_default=True, type=click.FloatRange(min=0),
              help="On Ctrl-C or SIGTERM, how long in-flight requests may finish.")
@click.option("--device", default="auto", show_default=True,
              help="Replica device: auto (cuda where Ray gave the replica a GPU), cpu or cuda.")
@click.option("--address", help="Ray cluster to join (e.g. auto) [default: RAY_ADDRESS, else a "
              "local Ray started and stopped by this command].")
@click.option("--verbose", is_flag=True, help="Show Ray's own log lines.")
@click.option("--noop", is_flag=True, hidden=True,
              help="Serve a fixed reply without the model (the load test's baseline).")
def serve(directory: Path, host: str, port: int, replicas: int, gpus_per_replica: float | None,
          cpus_per_replica: float | None, ingress: str, max_batch_size: int | None,
          max_batch_wait_ms: float, exact: bool, max_ongoing_requests: int,
          max_queued_requests: int, max_body_mb: float, body_timeout_s: float,
          auth_token_file: Path | None, grace_s: float, device: str, address: str | None,
          verbose: bool, noop: bool) -> None:
    """Serve DIRECTORY over HTTP on Ray Serve until Ctrl-C or SIGTERM (pip install
    'qkan-pack[serve]').

    Single rows from concurrent requests are batched into the captured shapes. GET /
    describes the artifact, POST / {"inputs": [[...]]} predicts, GET /stats counts replays,
    POST /stats/reset zeroes the counters. Every reply is JSON.
    """
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise click.ClickException("Ray Serve is not installed: pip install 'qkan-pack[serve]'")
    from .serve import HttpLimits, Listen, ServeOptions, serve_forever

    token = _read_token(auth_token_file)
    limits = HttpLimits(max_body_bytes=int(max_body_mb * 2**20), body_timeout_s=body_timeout_s,
                        max_ongoing=max_ongoing_requests, max_queued=max_queued_requests)
    options = ServeOptions(replicas=replicas, max_batch_size=max_batch_size,
                           max_batch_wait_ms=max_batch_wait_ms, exact=exact, device=device,
                           grace_s=grace_s, limits=limits)
    listen = Listen(host=host, port=port, address=address, ingress=ingress, verbose=verbose)

    def ready(url: str, description: dict) -> None:
        what = "a no-op reply" if noop else f"{directory} ({description['digest']})"
        click.echo(f"serving {what} at {url} with {replicas} replica(s) on "
                   f"{description['replica']['device']}" + ("; bearer token required" if token else ""))
        if not noop:
            click.echo(f"accepted: {'; '.join(description['accepted'])}")
        click.echo("Ctrl-C or SIGTERM stops (drains for "
                   f"{grace_s:g} s)", err=True)

    serve_forever(directory, options, listen, token=token, cpus_per_replica=cpus_per_replica,
                  gpus_per_replica=gpus_per_replica, noop=noop, on_ready=ready,
                  notice=lambda line: click.echo(line, err=True))
    click.echo("stopped", err=True)


def main(argv: Sequence[str] | None = None) -> None:
    cli.main(args=list(argv) if argv is not None else None, prog_name="qkan-pack")
