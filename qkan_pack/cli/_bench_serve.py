"""``qkan-pack bench-serve``: load-test ``qkan-pack serve`` (started here as a process) over
loopback."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import click

from ..errors import ShapeSpecError
from ._app import cli
from ._params import comma_list, parsed
from ._token import read_token


def length_range(text: str) -> tuple[int, int]:
    """``LOW,HIGH`` with 1 <= LOW <= HIGH."""
    try:
        low, high = (int(v) for v in text.split(","))
    except ValueError:
        low = high = 0
    if not 1 <= low <= high:
        raise ShapeSpecError("write LOW,HIGH with 1 <= LOW <= HIGH, e.g. 8,128")
    return low, high


def client_counts(text: str) -> tuple[int, ...]:
    """``1,8,32``: one or more positive client counts."""
    try:
        counts = tuple(int(v) for v in comma_list(text))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise ShapeSpecError("write client counts as 1,8,32")
    return counts


def cpu_list(text: str) -> tuple[int, ...]:
    """``0-7,12``: CPU numbers and ranges, as ``taskset -c`` takes them."""
    cpus: set[int] = set()
    for part in comma_list(text):
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            first, last = 0, -1
        if not 0 <= first <= last:
            raise ShapeSpecError(f"{part!r} is not a CPU number or range (write 0-7,12)")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ShapeSpecError("write CPUs as 0-7,12")
    return tuple(sorted(cpus))


def cpu_split(text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``SERVER:CLIENTS``, two CPU lists (``0-7:8-15``)."""
    server, colon, clients = text.partition(":")
    if not colon:
        raise ShapeSpecError("write the server's CPUs, a colon and the clients', e.g. 0-7:8-15")
    return cpu_list(server), cpu_list(clients)


def protocol_names(text: str) -> tuple[str, ...]:
    protocols = comma_list(text)
    if not protocols:
        raise ShapeSpecError("write protocols as json,oip-binary")
    return protocols


@cli.command("bench-serve")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--clients", default="1,8,32,128,512", show_default=True, callback=parsed(client_counts),
              help="Concurrent clients per point, comma-separated.")
@click.option("--seconds", default=10.0, show_default=True, type=click.FloatRange(min=0.5),
              help="Timed seconds per point.")
@click.option("--warmup", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Untimed seconds of load before each point.")
@click.option("--processes", type=click.IntRange(min=1),
              help="Client processes (threads inside share the clients) [default: half the cores].")
@click.option("--serve-args", default="", metavar="'ARGS'",
              help="Options for `qkan-pack serve`, quoted: '--replicas 4 --gpus-per-replica 0.25'.")
@click.option("--protocol", "protocols", default="json", show_default=True, metavar="P,...",
              callback=parsed(protocol_names),
              help="Protocols measured side by side against one server, comma-separated: json "
                   "(POST /), oip-json and oip-binary (the Open Inference Protocol's HTTP infer, "
                   "JSON or binary tensors), oip-grpc (its gRPC ModelInfer; needs "
                   "tritonclient[grpc]).")
@click.option("--rows-per-request", default=1, show_default=True, type=click.IntRange(min=1),
              metavar="N", help="Rows in each request (a captured batch size of the artifact).")
@click.option("--no-noop", is_flag=True, help="Skip the no-op deployment baseline (JSON route).")
@click.option("--kill-at", type=click.FloatRange(min=0), metavar="SECONDS",
              help="Also SIGKILL one replica this long into a run at --kill-clients clients.")
@click.option("--kill-clients", default=32, show_default=True, type=click.IntRange(min=1),
              help="Clients during the replica kill.")
@click.option("--kills", default=1, show_default=True, type=click.IntRange(min=1),
              help="With --kill-at: a kill loop, one replica SIGKILLed this many times, every "
                   "--kill-every seconds once all replicas serve again; the run lasts until one "
                   "interval after the last.")
@click.option("--kill-every", default=15.0, show_default=True, type=click.FloatRange(min=1),
              metavar="SECONDS", help="Seconds between the kills of --kills.")
@click.option("--large-body-mb", type=click.FloatRange(min=0.001),
              help="Also measure single-row latency while two clients send bodies of this "
                   "many MB of numbers (rows; a 422 unless that row count is captured).")
@click.option("--lengths", callback=parsed(length_range), metavar="LOW,HIGH",
              help="Requests of random lengths, uniform in [LOW, HIGH], along the artifact's "
              "padded length axis (an artifact built with --pad).")
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(min=1),
              help="Measure every point this many rounds, each figure the median (protocols "
              "alternated, each round starting one further along).")
@click.option("--split-cpus", callback=parsed(cpu_split), metavar="SERVER:CLIENTS",
              help="Run the server (with Ray, HAProxy and its replicas) on the CPUs SERVER and "
              "the client processes on CLIENTS, e.g. 0-7:8-15 (disjoint; Linux), so that the "
              "clients take none of the server's CPU time.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535),
              help="Port the server under test listens on (loopback).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the results as JSON here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the curve as a PNG here (needs matplotlib).")
def bench_serve(directory: Path, clients: tuple, seconds: float, warmup: float,
                processes: int | None, serve_args: str, protocols: tuple, rows_per_request: int,
                no_noop: bool, kill_at: float | None,
                kill_clients: int, kills: int, kill_every: float, large_body_mb: float | None,
                lengths: tuple[int, int] | None, rounds: int,
                split_cpus: tuple[tuple[int, ...], tuple[int, ...]] | None, port: int,
                json_path: Path | None, plot_path: Path | None) -> None:
    """Load-test `qkan-pack serve DIRECTORY` (started here as a process) over loopback:
    req/s, rows/s, p50, p99 and rows per replay for each client count and protocol, beside a
    no-op deployment.

    DIRECTORY a model repository (REPO/<name>/<version>/): its aggregate with the clients
    spread over every model, against its first model served alone (a second server), and
    that model through the repository; every model must take the same inputs.
    """
    from ..bench import (
        ServeLoadSettings,
        is_repository,
        render_repository_load,
        render_serve_load,
        run_repository_load,
        run_serve_load,
        write_serve_json,
        write_serve_plot,
    )

    if kills > 1 and kill_at is None:
        raise click.UsageError("--kills goes with --kill-at")
    extra = {"processes": processes} if processes else {}
    args = _split_args(serve_args)
    settings = ServeLoadSettings(clients=clients, seconds=seconds, warmup=warmup,
                                 serve_args=args, noop=not no_noop,
                                 kill_at_s=kill_at, kill_clients=kill_clients, kills=kills,
                                 kill_every_s=kill_every,
                                 large_body_mb=large_body_mb, lengths=lengths, port=port,
                                 protocols=protocols, rows_per_request=rows_per_request,
                                 rounds=rounds, split_cpus=split_cpus, **extra)
    token = read_token(_token_file_in(args))
    if is_repository(directory):
        report = run_repository_load(directory, replace(settings, noop=False), token=token)
        click.echo(render_repository_load(report))
    else:
        report = run_serve_load(directory, settings, token=token)
        click.echo(render_serve_load(report))
    if json_path is not None:
        click.echo(f"wrote {write_serve_json(report, json_path)}")
    if plot_path is not None:
        click.echo(f"wrote {write_serve_plot(report, plot_path)}")


def _split_args(text: str) -> tuple[str, ...]:
    """--serve-args as the shell would split it; unbalanced quotes are a usage error."""
    import shlex

    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: {exc}", param_hint="--serve-args") from None


def _token_file_in(serve_args: Sequence[str]) -> Path | None:
    """The ``--auth-token-file`` among ``serve``'s arguments (bench-serve's clients send the
    token the server it starts will require); the last one, as click takes."""
    found = None
    for i, arg in enumerate(serve_args):
        if arg == "--auth-token-file" and i + 1 < len(serve_args):
            found = Path(serve_args[i + 1])
        elif arg.startswith("--auth-token-file="):
            found = Path(arg.partition("=")[2])
    return found
