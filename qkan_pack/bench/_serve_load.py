"""``qkan-pack bench-serve``: the load curve of ``qkan-pack serve`` on this host.

The server runs as its own process (``python -m qkan_pack serve ...``), exactly as a user
starts it; this module never imports the serve layer or Ray. For each mode (the artifact, then
``--noop``: Ray Serve's own ceiling with a fixed reply) it starts the server, runs every
client count (``_load``) in every protocol asked for, back to back against that one server
(the no-op speaks only the JSON route), reads every replica's replay counters (``GET
/metrics``, Prometheus's text read by its own parser), and stops the server with SIGTERM.
Optional runs, over the JSON route: SIGKILL of one replica under load (``kill_at_s``; with
``kills`` > 1, a kill loop: one replica every ``kill_every_s``), and single-row latency while
large bodies arrive (``large_body_mb``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .._ports import side_ports
from ..errors import BenchError
from ._cpus import check_split
from ._load import PROTOCOLS, LoadResult, LoadSpec, RowInput, Rows, grpc_messages, run_load
from ._serve_render import render_point
from ._serve_results import (
    SERVE_SCHEMA,
    Point,
    ServeLoadReport,
    median_point,
    protocol_ratios,
    summarise,
)
from ._server_process import ServerProcess, cpu_per_request, listening_ports

if TYPE_CHECKING:
    from ..format import InputDecl

#: Ray Serve's direct-ingress HTTP ports (its ``RAY_SERVE_DIRECT_INGRESS_{MIN,MAX}_HTTP_PORT``
#: defaults): a replica listening on one of them is serving, or about to.
INGRESS_PORTS = range(30000, 31001)
#: How long every replica must have listened before the kill loop kills one: Ray adds a
#: replacement to HAProxy's config after it listens, and a kill before that would leave the
#: other replicas' load with nowhere to go for a moment (not a kill in a healthy set).
KILL_SETTLE_S = 2.0


@dataclass(frozen=True)
class ServeLoadSettings:
    """What to measure; ``serve_args`` go to ``qkan-pack serve`` unchanged."""

    clients: tuple[int, ...] = (1, 8, 32, 128, 512)
    seconds: float = 10.0
    warmup: float = 2.0
    processes: int = max(1, (os.cpu_count() or 2) // 2)
    serve_args: tuple[str, ...] = ()
    noop: bool = True
    kill_at_s: float | None = None
    kill_clients: int = 32
    kills: int = 1
    kill_every_s: float = 15.0
    large_body_mb: float | None = None
    #: (low, high): requests of random lengths along the artifact's padded length axis
    #: (``build --pad``); None: rows of the first captured shape family.
    lengths: tuple[int, int] | None = None
    probe_clients: int = 8
    port: int = 8765
    start_timeout_s: float = 600.0
    #: Measured side by side at every client count, against one server (``PROTOCOLS``).
    protocols: tuple[str, ...] = ("json",)
    rows_per_request: int = 1  # a captured batch size of the artifact
    #: A model repository's measurement is repeated this many times, each figure the
    #: median (``_repo_load``).
    rounds: int = 1
    #: (server CPUs, client CPUs), disjoint (``--split-cpus``): the server and everything it
    #: starts on the first, the client processes on the second; None: anywhere.
    split_cpus: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    def __post_init__(self) -> None:
        unknown = [p for p in self.protocols if p not in PROTOCOLS]
        if not self.protocols or unknown or len(set(self.protocols)) != len(self.protocols):
            raise BenchError(f"protocols {list(self.protocols)}: give each once, from "
                             f"{', '.join(PROTOCOLS)}")
        if self.rows_per_request < 1:
            raise BenchError(f"rows per request must be at least 1, got {self.rows_per_request}")
        if self.rounds < 1:
            raise BenchError(f"rounds must be at least 1, got {self.rounds}")
        if self.split_cpus is not None:
            check_split(self.server_cpus, self.client_cpus)

    @property
    def server_cpus(self) -> frozenset[int]:
        return frozenset(self.split_cpus[0]) if self.split_cpus else frozenset()

    @property
    def client_cpus(self) -> frozenset[int]:
        return frozenset(self.split_cpus[1]) if self.split_cpus else frozenset()


def row_inputs(artifact: str, lengths: tuple[int, int] | None = None,
               rows_per_request: int = 1) -> Rows:
    """What one row of a request carries, from the manifest: per input its name, the row
    shape of the first shape family that takes rows, and values of its dtype drawn from the
    range the build drew reference inputs from (token ids stay inside the embedding),
    clipped to what the dtype holds. ``rows_per_request`` must be a batch size captured for
    those rows (at some length, with ``lengths``). With ``lengths``, the dims of the
    artifact's first padded length axis are marked to vary (``build --pad``; refused
    without it)."""
    from ..format import padding_table
    from ..runtime import read_artifact

    manifest = read_artifact(artifact).manifest
    table = padding_table(manifest)
    tails = list(table)
    if not tails:
        raise BenchError("bench-serve sends rows, and no captured shape of this artifact "
                         "takes rows (every input must lead with one batch size)")
    batches = sorted({batch for tail in (tails if lengths else tails[:1]) for batch, _ in table[tail]})
    if rows_per_request not in batches:
        raise BenchError(f"--rows-per-request {rows_per_request} is not a captured batch size "
                         f"of this artifact; captured: {', '.join(map(str, batches))} (build "
                         f"with a {rows_per_request}-row shape to measure it)")
    rows = tuple(_row_input(decl, shape) for decl, shape in zip(manifest.inputs, tails[0]))
    if lengths is None:
        return rows
    padding = manifest.padding
    axis = next((a for a in padding.axes if a.inputs[0][1] != 0), None) if padding else None
    if axis is None:
        raise BenchError("--lengths needs an artifact built with --pad and a padded length "
                         "axis (besides the batch); this one has none")
    longest = max(dict(e.inputs)[axis.inputs[0][0]][axis.inputs[0][1]] for e in manifest.shapes)
    if not 1 <= lengths[0] <= lengths[1] <= longest:
        raise BenchError(f"--lengths {lengths[0]},{lengths[1]}: give 1 <= LOW <= HIGH <= "
                         f"{longest}, the longest captured length")
    varying = {name: dim - 1 for name, dim in axis.inputs}  # row dims: without the batch
    return tuple(replace(row, varying=(varying[row.name],)) if row.name in varying else row
                 for row in rows)


def _row_input(decl: InputDecl, shape: tuple[int, ...]) -> RowInput:
    from ..format import DTYPES

    dtype = DTYPES[decl.dtype]
    if dtype.kind == "bool":
        return RowInput(decl.name, tuple(shape), "bool", dtype=decl.dtype)
    low = decl.low if decl.low is not None else (0 if dtype.kind == "int" else -1.0)
    high = decl.high if decl.high is not None else (2 if dtype.kind == "int" else 1.0)
    if dtype.int_limits is not None:
        low, high = max(low, dtype.int_limits[0]), min(high, dtype.int_limits[1] + 1)
    return RowInput(decl.name, tuple(shape), dtype.kind, low, high, dtype=decl.dtype)


def run_serve_load(artifact: str | Path, settings: ServeLoadSettings | None = None, *,
                   token: str | None = None) -> ServeLoadReport:
    """Every client count in every protocol against the artifact (and the no-op), then the
    optional runs. ``token``: the bearer token the server requires (``serve
    --auth-token-file`` among the serve arguments); it is sent, never recorded in the
    report. Settings the artifact or this host cannot run are refused before any server
    starts."""
    settings = settings or ServeLoadSettings()
    artifact = str(artifact)
    rows = row_inputs(artifact, settings.lengths, settings.rows_per_request)
    if "oip-grpc" in settings.protocols:
        grpc_messages()
    report = ServeLoadReport(
        schema=SERVE_SCHEMA, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        artifact=artifact, command=sys.argv, settings=asdict(settings), machine=host_info())
    modes = [("model", ())] + ([("noop", ("--noop",))] if settings.noop else [])
    with sigterm_as_exit():
        for mode, extra in modes:
            _measure_mode(artifact, mode, extra, rows, settings, report, token)
    report.ratios, report.ratio_ranges = protocol_ratios(report.curves.get("model", []))
    return report


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """SIGTERM (``timeout``, a supervisor, ``kill``) raises ``SystemExit`` here instead of
    ending the process at once, so that the ``finally`` stopping the server runs: the server
    lives in its own session, and would otherwise keep its port, its replicas and its Ray."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_now(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_now)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _measure_mode(artifact: str, mode: str, extra: Sequence[str], rows: Rows,
                  settings: ServeLoadSettings, report: ServeLoadReport, token: str | None) -> None:
    """One server (the artifact, or the no-op): every client count in every protocol (the
    protocols back to back at each count, so that they meet the same server state), then
    the optional runs."""
    protocols = settings.protocols if mode == "model" else ("json",)
    grpc_port = side_ports(1, exclude={settings.port})[0] if "oip-grpc" in protocols else 0
    server = ServerProcess(artifact, [*settings.serve_args, *extra], settings.port,
                           settings.start_timeout_s, token, grpc_port, settings.server_cpus)
    report.server[mode] = {"ready": server.ready_line, "command": server.command}
    try:
        if any(p != "json" for p in protocols):
            server.oip_model = _oip_model(server)
        report.curves[mode] = _measure_rounds(server, rows, protocols, settings, mode == "model")
        if mode == "model":
            _optional_runs(server, rows, settings, report)
    finally:
        report.server[mode]["exit_code"] = server.stop()


def _measure_rounds(server: ServerProcess, rows: Rows, protocols: Sequence[str],
                    settings: ServeLoadSettings, has_stats: bool) -> list[Point]:
    """Every client count in every protocol, ``rounds`` times (``rounds_of``, the protocols
    alternated); each point the median of its rounds."""
    curves = rounds_of(settings, protocols, lambda clients, protocol: measure_point(
        server, rows, clients, settings, has_stats, protocol), alternate=True)
    return [curves[protocol][index] for index in range(len(settings.clients))
            for protocol in protocols]


Kind = TypeVar("Kind", bound=str)


def rounds_of(settings: ServeLoadSettings, kinds: Sequence[Kind],
              measure: Callable[[int, Kind], Point], *, alternate: bool) -> dict[Kind, list[Point]]:
    """Each kind's curve (a point per client count, each the median of ``rounds``): every
    round measures, at each client count, the kinds back to back, so that they meet the same
    server state; with ``alternate`` each round starts one further along (json, binary, grpc;
    then binary, grpc, json...), so that none always follows the same one."""
    runs: dict[Kind, dict[int, list[Point]]] = {kind: {} for kind in kinds}
    for round_ in range(settings.rounds):
        if settings.rounds > 1:
            print(f"== round {round_ + 1} of {settings.rounds}", file=sys.stderr, flush=True)
        turn = round_ % len(kinds) if alternate else 0
        for clients in settings.clients:
            for kind in (*kinds[turn:], *kinds[:turn]):
                runs[kind].setdefault(clients, []).append(measure(clients, kind))
    return {kind: [median_point(points) for points in by_clients.values()]
            for kind, by_clients in runs.items()}


def _oip_model(server: ServerProcess) -> str:
    """The name the server gives the model in the Open Inference Protocol (``GET /``)."""
    oip = server.get("/").get("oip")
    if not isinstance(oip, dict) or not oip.get("model"):
        raise BenchError("the server's GET / names no Open Inference Protocol model (\"oip\"); "
                         "this qkan-pack serve does not speak the protocol")
    return str(oip["model"])


def _optional_runs(server: ServerProcess, rows: Rows, settings: ServeLoadSettings,
                   report: ServeLoadReport) -> None:
    if settings.large_body_mb:
        report.large_bodies = measure_large_bodies(server, rows, settings)
    if settings.kill_at_s is not None:
        report.kill = measure_kill(server, rows, settings)


def load_spec(server: ServerProcess, rows: Rows, clients: int, settings: ServeLoadSettings,
          **changes: Any) -> LoadSpec:
    return LoadSpec(host="127.0.0.1", port=server.port, clients=clients, seconds=settings.seconds,
                    warmup=settings.warmup, rows=rows, token=server.token,
                    **{"lengths": settings.lengths, "rows_per_request": settings.rows_per_request,
                       "model": server.oip_model, "grpc_port": server.grpc_port,
                       "cpus": settings.client_cpus, **changes})


def measure_point(server: ServerProcess, rows: Rows, clients: int, settings: ServeLoadSettings,
                  has_stats: bool, protocol: str = "json", **changes: Any) -> Point:
    """One point: the load (``changes`` to its ``LoadSpec``, such as a repository's
    ``paths``), its rows per replay (``has_stats``: the server counts replays) and the CPU
    each part of the server and the clients spent per request."""
    before = server.replay_totals() if has_stats else None
    cpu_before = server.cpu_by_process()
    result = run_load(load_spec(server, rows, clients, settings, protocol=protocol, **changes),
                      settings.processes)
    point = summarise(clients, result, settings.seconds, protocol, settings.rows_per_request)
    point.cpu_us_per_request.update(
        cpu_per_request(cpu_before, server.cpu_by_process(), result.sent))
    if before is not None:
        rows_replayed, replays = (now - then for now, then in zip(server.replay_totals(), before))
        point.rows_per_replay = round(rows_replayed / replays, 2) if replays else None
    print(render_point(point), file=sys.stderr, flush=True)
    return point


def measure_kill(server: ServerProcess, rows: Rows, settings: ServeLoadSettings) -> dict[str, Any]:
    """SIGKILL one replica ``kill_at_s`` into a timed run at ``kill_clients`` clients; with
    ``kills`` > 1, again every ``kill_every_s`` (each once every replica serves again,
    ``KillLoop``), the run lasting until ``kill_every_s`` after the last kill's turn. Every
    status and error the clients saw, by type."""
    replicas = server.replica_pids()
    if not replicas:
        raise BenchError("no replica process found to kill")
    kill_at = settings.kill_at_s or 0.0
    seconds = (settings.seconds if settings.kills == 1
               else kill_at + settings.kills * settings.kill_every_s)
    started = time.monotonic() + settings.warmup + 1.0  # run_load's clients start 1 s in
    loop = KillLoop(server, len(replicas), settings.kills, first_at=started + kill_at,
                    every_s=settings.kill_every_s, until=started + seconds)
    loop.start()
    try:
        result = run_load(replace(load_spec(server, rows, settings.kill_clients, settings),
                                  seconds=seconds), settings.processes)
    finally:
        loop.stop()
    point = summarise(settings.kill_clients, result, seconds)
    return {"replicas_before": len(replicas), "killed_after_s": settings.kill_at_s,
            "kills": len(loop.kills), "kill_every_s": settings.kill_every_s, "seconds": seconds,
            "killed": [{"at_s": round(at - started, 3), "pid": pid, "late_s": round(late, 3)}
                       for at, pid, late in loop.kills],
            "point": asdict(point), "failed": sum(v for k, v in point.statuses.items() if k != "200"),
            "replicas_after": len(_wait_replicas(server, len(replicas), 60.0))}


class KillLoop(threading.Thread):
    """SIGKILLs one of the server's ``replicas`` at ``first_at`` (``time.monotonic``), then
    every ``every_s``, ``count`` times in all, none after ``until``. Each kill waits until
    every replica has listened on its ingress port for ``KILL_SETTLE_S``, so that no kill
    finds the previous one's replacement still starting (the kill is then late, by
    ``late_s``). ``kills``: (when, pid, how late) of each."""

    def __init__(self, server: ServerProcess, replicas: int, count: int, *, first_at: float,
                 every_s: float, until: float) -> None:
        super().__init__(daemon=True)
        self.server, self.replicas, self.count = server, replicas, count
        self.first_at, self.every_s, self.until = first_at, every_s, until
        self.kills: list[tuple[float, int, float]] = []
        self._stopped = threading.Event()
        self._serving_since: dict[int, float] = {}

    def run(self) -> None:
        due = self.first_at
        while len(self.kills) < self.count and due < self.until:
            victim = self._settled_replica(due)
            if victim is None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
                now = time.monotonic()
                self.kills.append((now, victim, now - due))
                due = now + self.every_s

    def stop(self) -> None:
        self._stopped.set()
        self.join()

    def _settled_replica(self, due: float) -> int | None:
        """A replica to kill (the oldest process) at ``due`` or once all serve and have for
        ``KILL_SETTLE_S``, watching them meanwhile (so that a replacement's start is seen
        when it comes); None when stopped or past ``until`` first."""
        while not self._stopped.is_set() and time.monotonic() < self.until:
            now = time.monotonic()
            serving = [pid for pid in self.server.replica_pids()
                       if listening_ports(pid) & set(INGRESS_PORTS)]
            self._serving_since = {pid: self._serving_since.get(pid, now) for pid in serving}
            if (now >= due and len(serving) >= self.replicas
                    and all(now - since >= KILL_SETTLE_S for since in self._serving_since.values())):
                return min(serving)
            self._stopped.wait(min(0.2, max(0.01, due - now)))
        return None


def _wait_replicas(server: ServerProcess, count: int, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while len(pids := server.replica_pids()) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    return pids


def measure_large_bodies(server: ServerProcess, rows: Rows, settings: ServeLoadSettings
                         ) -> dict[str, Any]:
    """Single-row latency at ``probe_clients`` clients, alone and while two clients send
    ``large_body_mb`` bodies back to back."""
    import threading

    size = int((settings.large_body_mb or 0) * 2**20)
    alone = run_load(load_spec(server, rows, settings.probe_clients, settings), settings.processes)
    big = LoadResult()
    sender = threading.Thread(target=lambda: big.merge(run_load(
        load_spec(server, rows, 2, settings, body_bytes=size), 1)), daemon=True)
    sender.start()
    during = run_load(load_spec(server, rows, settings.probe_clients, settings), settings.processes)
    sender.join()
    return {"body_mb": settings.large_body_mb, "clients": settings.probe_clients,
            "alone": asdict(summarise(settings.probe_clients, alone, settings.seconds)),
            "during": asdict(summarise(settings.probe_clients, during, settings.seconds)),
            "large": asdict(summarise(2, big, settings.seconds))}


def host_info() -> dict[str, Any]:
    """The host, without importing torch or touching a GPU (the server owns it)."""
    import platform

    from ._machine import cpu_name

    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False) if _has("nvidia-smi") else None
    return {"hostname": platform.node(), "platform": platform.platform(terse=True),
            "python": platform.python_version(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "gpu": gpu.stdout.strip().splitlines()[0] if gpu and gpu.stdout.strip() else None}


def _has(program: str) -> bool:
    import shutil

    return shutil.which(program) is not None
