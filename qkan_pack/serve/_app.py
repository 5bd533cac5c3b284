"""Serve an artifact on Ray Serve: one ``Predictor`` per replica, rows batched into captured shapes.

    from ray import serve
    from qkan_pack.serve import build_app

    handle = serve.run(build_app("artifacts/qkan_mlp"))   # returns once every replica is ready
    handle.predict.remote(np.zeros((1, 2), np.float32)).result()

Each replica loads one ``Predictor`` in its constructor (``cuda`` where the replica was given a
GPU, else ``cpu``) and captures every graph there, so Ray Serve reports it ready only after
capture: no request pays for it, and a replica whose load fails never serves (its constructor
raised; Ray retries it and the deployment fails if none loads). ``check_health`` fails once a
replay hit a device error, and Ray replaces the replica.

A single row (unbatched ``[2]`` or a batch of one ``1x2``, for shapes ``1x2,64x2``) is
gathered with concurrent rows (``_gather``; HTTP, gRPC and handle calls alike) into the
smallest captured batch that holds them where build proved rows independent, replayed once
and split back (``exact=True``: each row replays alone, so its answer never depends on its
neighbours' bits). A captured shape (``64x2``) passes through; anything else is a 422
naming the accepted shapes. The HTTP API is ``_http.HttpApi``; ``GET /metrics`` is every
replica's ``metric_families`` (``_metrics``).

Ray is imported only where a deployment is built or run: ``import qkan_pack`` stays cheap.
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import ServeError
from ..format import MODEL_NAME, check_device_text
from ._auth import app_checks_tokens_of
from ._cluster import load_failed, this_node
from ._grpc_http import answer_over_http, grpc_message_limit, is_grpc_call
from ._haproxy_admin import ingress_counts
from ._http import HttpApi, HttpLimits, Reports, forwarded_request
from ._http_replies import json_response
from ._metrics import (
    Ingress,
    ReplicaInfo,
    every_replica,
    exposition,
    merge,
    replica_families,
    scrape_family,
)
from ._model import ModelCore
from ._oip import OipModel
from ._oip_grpc import ForwardedCall, add_rpc_methods
from ._ray_compat import haproxy_admin_socket
from ._rows import dependent_rows, describe_artifact, largest_batch, row_plan
from ._statistics import merged_statistics, replica_statistics
from ._uvicorn_compat import write_replies_whole
from ._wire import is_tensor, map_leaves, torch_module

if TYPE_CHECKING:
    from ray.serve import Application
    from starlette.requests import Request
    from starlette.responses import Response

    from ..format import Manifest
    from ..runtime import VerifiedArtifact
    from ._oip_grpc import GrpcApi

#: Replies of the no-op deployment (``--noop``): the floor Ray Serve's own path sets.
NOOP_REPLY = b'{"outputs":[[0.0,0.0]]}'
#: The longest fixed batching wait (``ServeOptions.max_batch_wait_ms``): a lone row waits it
#: whole, so a longer one is no latency anyone serves at, and an infinite one never answers.
MAX_BATCH_WAIT_MS = 60_000.0
#: The most replicas of one deployment (an artifact, or a model version): Ray's controller
#: keeps state per replica it is asked for, placed or not, and a million asked of two CPUs
#: grew it past the host's memory. Many more replicas are many deployments (model versions)
#: or a larger one each (``cpus_per_replica``, ``gpus_per_replica``).
MAX_REPLICAS = 1000
#: The most rows gathered into one replay: a captured batch larger than this is no batch a
#: replica could fill from concurrent requests (each is a request of its own).
MAX_BATCH_SIZE = 65_536
#: The longest drain on Ctrl-C or SIGTERM (an hour): a longer one never ends a stop.
MAX_GRACE_S = 3600.0
#: The replica's youngest-generation collection threshold (CPython's default: 700).
REPLICA_GC_THRESHOLD = 7000
logger = logging.getLogger(__name__)


def raise_young_gc_threshold() -> None:
    """Collect the youngest generation after ``REPLICA_GC_THRESHOLD`` net allocations, not 700.

    Why: a request waiting for its batch holds ~200 container objects of Ray's and ours
    (coroutines, contexts, headers); CPython counts their allocation, but their release
    later counts only while the count is above zero, so with many requests in flight a
    replica at the default threshold runs a young collection every few dozen requests, each
    scanning the live requests' objects and finding almost nothing: microseconds of every
    request's CPU (measurements:
    ``benchmarks/results/2026-12-04_cpu_replica-cpu-per-request.md``). At 7,000 the count
    stays above zero and collections are rare; garbage cycles are still collected, just in
    larger, rarer batches. Ray Serve freezes a replica's startup objects but leaves this
    threshold alone (it tunes only its proxy's: ``RAY_SERVE_PROXY_GC_THRESHOLD``). A no-op
    replica, whose requests never wait, is unaffected either way."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(REPLICA_GC_THRESHOLD, older, oldest)


def tune_replica_process() -> None:
    """What every replica's process gets, a model's and the no-op's alike (the no-op stays
    the same server without the model): rare young collections, and replies written whole
    (``_uvicorn_compat``)."""
    raise_young_gc_threshold()
    for reason in write_replies_whole():
        logger.warning("replies are written in two pieces here: %s", reason)


@dataclass(frozen=True)
class ServeOptions:
    """How a deployment serves (everything but where it listens); checked on creation."""

    replicas: int = 1
    gpus_per_replica: float = 0.0
    cpus_per_replica: float = 1.0
    max_batch_size: int | None = None
    max_batch_wait_ms: float | None = None  # None: groups close once rows stop arriving
    exact: bool = False
    device: str = "auto"
    grace_s: float = 10.0
    limits: HttpLimits = field(default_factory=HttpLimits)
    #: The model's name in the Open Inference Protocol's URLs (``/v2/models/{name}``); None:
    #: the artifact's own (``build --name``, default the model file's stem).
    model_name: str | None = None
    #: The version in those URLs (``/v2/models/{name}/versions/{version}``); None: the
    #: artifact's own. A model repository's version directory sets it, and with it the
    #: repository's JSON routes (``/models/{name}[/versions/{version}]``) on the replica.
    model_version: str | None = None
    #: Whether replicas answer the protocol over gRPC (``serve --grpc-port``): they then
    #: load its stubs as they start (``_oip_grpc.protocol``), before a request arrives.
    grpc: bool = False

    def __post_init__(self) -> None:
        problems = [name for name, ok in (
            (f"1 <= replicas <= {MAX_REPLICAS}", 1 <= self.replicas <= MAX_REPLICAS),
            ("0 <= gpus_per_replica < inf", 0 <= self.gpus_per_replica < math.inf),
            ("0 <= cpus_per_replica < inf", 0 <= self.cpus_per_replica < math.inf),
            (f"1 <= max_batch_size <= {MAX_BATCH_SIZE}", self.max_batch_size is None
             or 1 <= self.max_batch_size <= MAX_BATCH_SIZE),
            (f"0 <= max_batch_wait_ms <= {MAX_BATCH_WAIT_MS:g}", self.max_batch_wait_ms is None
             or 0 <= self.max_batch_wait_ms <= MAX_BATCH_WAIT_MS),
            (f"0 <= grace_s <= {MAX_GRACE_S:g}", 0 <= self.grace_s <= MAX_GRACE_S),
            ("max_body_bytes >= 1", self.limits.max_body_bytes >= 1),
            ("max_ongoing_requests >= 1", self.limits.max_ongoing is None or self.limits.max_ongoing >= 1),
            ("max_queued_requests >= 0", self.limits.max_queued is None or self.limits.max_queued >= 0),
        ) if not ok]
        if problems:
            raise ServeError(f"serve options out of range: need {', '.join(problems)}")
        check_device_text(self.device)  # before Ray starts replicas that would all fail
        if self.model_name is not None and not MODEL_NAME.match(self.model_name):
            raise ServeError(f"--name {self.model_name!r}: a model name is letters, digits, "
                             "'.', '_' and '-' (at most 128, starting with a letter or digit): "
                             "it is part of the protocol's URLs")
        if self.model_version is not None and not MODEL_NAME.match(self.model_version):
            raise ServeError(f"model version {self.model_version!r}: letters, digits, '.', '_' "
                             "and '-' (it is part of the protocol's URLs)")

    def for_artifact(self, manifest: Manifest) -> ServeOptions:
        """These options with the admission bounds the user left unset derived from the batch
        a replica replays (``HttpLimits.with_admission``); the same on every call."""
        batch = 1 if self.exact else self.max_batch_size or largest_batch(row_plan(manifest))
        return replace(self, limits=self.limits.with_admission(batch))


class ArtifactServer:
    """Ray Serve replica body: the model (``ModelCore``), the HTTP API, handle methods.

    Wrap with ``build_app`` (which sets the deployment options); the class stays importable
    without Ray so that replicas pickle it by reference. Constructing one tunes its process
    for serving (``tune_replica_process``: the young-generation GC threshold, uvicorn writing
    replies whole): meant for a replica's own process, it applies to any process that builds
    one (Ray's local testing mode, a benchmark).
    """

    def __init__(self, path: str, *, digest: str | None = None, options: ServeOptions | None = None,
                 predictor_options: Mapping[str, Any] | None = None) -> None:
        from ..runtime import Predictor

        options = options or ServeOptions()
        tune_replica_process()
        self._node = this_node()
        try:
            predictor = Predictor.load(path, options.device, expected_digest=digest,
                                       progress=False, **dict(predictor_options or {}))
        except Exception as exc:  # on a cluster, which node failed is half the answer
            if self._node["node_id"] is None:  # outside Ray: one process, its own error
                raise
            raise load_failed(exc, path, self._node) from exc
        plan = row_plan(predictor.manifest)
        self.core = ModelCore(predictor, max_batch_size=options.max_batch_size or largest_batch(plan),
                              max_batch_wait_ms=options.max_batch_wait_ms, exact=options.exact)
        self._description = describe_artifact(predictor.manifest, predictor.digest, plan)
        self._description["serving"] = {
            "exact": options.exact, "max_batch_size": self.core.max_batch_size,
            "batches_requests": self.core.mixes,
            "rows_not_independent": [text for texts in dependent_rows(predictor.manifest).values()
                                     for text in texts],
            "max_batch_wait_ms": options.max_batch_wait_ms,
            "batch_closes": self.core.batch_rule,
            **{k: v for k, v in asdict(options.limits).items() if k != "token_sha256"},
            "auth": options.limits.token_sha256 is not None,
        }
        self._replica = {"id": _replica_id(), **self._node, "device": str(predictor.device),
                         "load_to_ready_seconds": round(predictor.report.load_to_ready_seconds, 3),
                         "captured": [r.label for r in predictor.report.shapes],
                         "ready_at": time.time()}
        self.oip = oip_model(predictor.manifest, options.model_name, batched=bool(plan),
                             version=options.model_version)
        self._grpc: GrpcApi | None = None
        self._grpc_http: GrpcApi | None = None
        self._grpc_on = options.grpc  # without --grpc-port, a gRPC-like request is HTTP's
        self._token_sha256 = options.limits.token_sha256
        self._description["oip"] = {"model": self.oip.name, "version": self.oip.version}
        self._metrics_info = replica_info(predictor, self.oip, self._replica,
                                          max(e.rows for e in self.core.stats.entries.values()))
        self.http = HttpApi(self.core, options.limits,
                            Reports(self.describe, self.stats, self.scrape, self.statistics),
                            self._description["accepted"], self.oip,
                            aliases=json_routes(self.oip) if options.model_version else ())
        if options.grpc:
            _ = self.grpc  # the stubs, registered for unpickling requests, before any arrives
            app_checks_tokens_of(is_grpc_call)  # over HTTP: GrpcApi checks their token

    @property
    def predictor(self) -> Any:
        return self.core.predictor

    async def predict(self, *inputs: Any, **named: Any) -> Any:
        """Outputs for one request (batched when it is a single row): numpy in, numpy out;
        tensors in, tensors out. bfloat16 outputs are tensors either way (numpy has none)."""
        given = self.core.given(inputs, named)
        outputs = await self.core.infer(given)
        if not any(is_tensor(g.array) for g in given.values()):
            return outputs
        from_numpy = torch_module().from_numpy
        return map_leaves(lambda a: a if is_tensor(a) else from_numpy(a), outputs)

    def describe(self) -> dict[str, Any]:
        """The artifact and this replica (its Ray node among it: ``_cluster.this_node``), as
        ``GET /`` returns them (no process ids)."""
        return {**self._description, "replica": dict(self._replica)}

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """This replica's counters (``reset`` zeroes them after reading)."""
        return {"replica": self._replica["id"], **self._node,
                **self.core.stats.view(reset=reset)}

    def check_health(self) -> None:
        """Ray Serve's health probe (see ``ModelCore.check_health``)."""
        self.core.check_health()

    async def metric_families(self) -> list[Any]:
        """This replica's Prometheus families (``_metrics``): what a scrape asks every
        replica for over the deployment handle."""
        ingress = None
        socket = haproxy_admin_socket()
        if socket is not None:
            counts = await ingress_counts(socket)
            ingress = Ingress(**counts) if counts is not None else None
        return replica_families(self.core.stats.snapshot(), self._metrics_info,
                                self.core.gpu_memory(), ingress, self.http.admission.pending())

    async def model_statistics(self) -> list[Any]:
        """(this replica's id, its entry of Triton's statistics extension: ``_statistics``),
        as a list: what ``statistics`` asks every replica for."""
        return [self._replica["id"], replica_statistics(
            self.core.stats.snapshot(), self.core.stats.entries, self.oip.name,
            self.oip.version)]

    async def statistics(self) -> list[dict[str, Any]]:
        """``GET .../stats``, gRPC ``ModelStatistics``: every replica's entry, summed (the
        replicas gathered as a scrape gathers them, each once: the broadcast reaches this
        replica too)."""
        parts, _, _ = await every_replica("model_statistics", await self.model_statistics())
        return [merged_statistics(list(dict(parts).values()))]

    async def scrape(self) -> tuple[bytes, str]:
        """``GET /metrics``: every replica's families, merged (``_metrics.every_replica``)."""
        parts, answered, failed = await every_replica("metric_families",
                                                      await self.metric_families())
        return exposition([*merge(parts), scrape_family(answered, failed)])

    async def __call__(self, request: Request) -> Response:
        if self._grpc_on and is_grpc_call(request.scope):  # HAProxy passes them on as HTTP/1.1
            return await answer_over_http(self.grpc_over_http, request,
                                          grpc_message_limit(self.http.limits))
        return await self.http.handle(request)

    async def forward_http(self, method: str, path: str, headers: list[tuple[bytes, bytes]],
                           body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """A request a model repository's router passes on over the handle (the client's
        method, path, headers and body), answered by the same HTTP API as one that came
        from the ingress: (status, headers, body)."""
        reply = await self.http.handle(forwarded_request(method, path, headers, body))
        return reply.status_code, list(reply.raw_headers), bytes(reply.body)

    async def forward_grpc(self, rpc: str, request: Any, metadata: tuple[tuple[str, str], ...]
                           ) -> tuple[Any, str | None, str, tuple[tuple[str, str], ...]]:
        """An RPC a model repository's router passes on over the handle: (reply, the status
        it set by name, None for OK, its details, and its trailing metadata)."""
        context = ForwardedCall(metadata)
        reply = await self.grpc.answer(rpc, request, context)
        return (reply, getattr(context.code, "name", None), context.details,
                context.trailing_metadata)

    # -- the Open Inference Protocol over gRPC (``serve --grpc-port``; ``_oip_grpc``) ----
    # Ray Serve calls the method named after each RPC with its request message.

    @property
    def grpc(self) -> GrpcApi:
        if self._grpc is None:  # tritonclient's stubs imported on the first gRPC call
            from ._oip_grpc import GrpcApi

            self._grpc = GrpcApi(self.oip, self.core, self._token_sha256, self.http.admission,
                                 self.http.limits.retry_after_s,
                                 infer=functools.partial(self.core.infer, paced=True),
                                 answered=functools.partial(self.core.stats.answered, "oip-grpc"),
                                 statistics=self.statistics)
        return self._grpc

    @property
    def grpc_over_http(self) -> GrpcApi:
        """The same RPCs for calls HAProxy passes on as HTTP/1.1 (``_grpc_http``). Their rows
        arrive as HTTP rows do, so they are not paced (``_gather``): holding a group open for
        the next one cost about 45 µs of a replica's time per call in process (stub replay, 32
        clients; ``benchmarks/results/2026-12-07_cpu_grpc-over-http1-pacing.txt``)."""
        if self._grpc_http is None:
            from ._oip_grpc import GrpcApi

            self._grpc_http = GrpcApi(self.oip, self.core, self._token_sha256,
                                      self.http.admission, self.http.limits.retry_after_s,
                                      answered=functools.partial(self.core.stats.answered,
                                                                 "oip-grpc"),
                                      statistics=self.statistics)
        return self._grpc_http


add_rpc_methods(ArtifactServer)  # Ray Serve calls the method named after each RPC


class NoopServer:
    """Reads the body and returns one fixed row: the ceiling Ray Serve's own HTTP path sets
    on a host, whatever the model (``qkan-pack serve --noop``, the load test's baseline)."""

    def __init__(self, max_body_bytes: int = 8 * 2**20) -> None:
        tune_replica_process()
        self.max_body_bytes = max_body_bytes

    async def __call__(self, request: Request) -> Response:
        from starlette.responses import Response

        if request.method != "POST":
            return json_response(200, self.describe())
        await request.body()
        return Response(NOOP_REPLY, media_type="application/json")

    def describe(self) -> dict[str, Any]:
        return {"noop": True, "replica": {"id": _replica_id(), "device": "none"}}


def replica_info(predictor: Any, oip: OipModel, replica: Mapping[str, Any],
                 max_rows: int) -> ReplicaInfo:
    """What the metrics say about a replica beside its counters (``_metrics.ReplicaInfo``)."""
    report = predictor.report
    tests = tuple((shape.label, test, float(value)) for shape in report.shapes
                  for test, value in (("reference", shape.reference_max_abs),
                                      ("replay", shape.replay_max_abs)))
    return ReplicaInfo(oip.name, oip.version, replica["id"], replica["device"],
                       replica["load_to_ready_seconds"], replica["ready_at"], tests, max_rows)


def oip_model(manifest: Manifest, name: str | None, *, batched: bool,
              version: str | None = None) -> OipModel:
    """The Open Inference Protocol's view of the artifact: named ``name`` (and ``version``)
    or as built."""
    from .._version import __version__

    metadata = manifest.metadata
    return OipModel(manifest, name or metadata.name or "model",
                    version or metadata.version or "1", batched=batched,
                    server_version=__version__)


def json_routes(oip: OipModel) -> tuple[str, ...]:
    """A repository member's JSON routes (``POST`` predicts, ``GET`` describes), beside
    ``POST /``: the model's and its version's."""
    return f"/models/{oip.name}", f"/models/{oip.name}/versions/{oip.version}"


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return "local"


def ray_ongoing_limit(limits: HttpLimits) -> int:
    """Ray's own per-replica limit, set far above ours so that our admission (JSON 503 with
    Retry-After) always answers before Ray's plain-text backpressure could."""
    return 4 * sum(limits.admission_bounds(1)) + 64


def build_app(path: str | os.PathLike[str], options: ServeOptions | None = None, *,
              predictor_options: Mapping[str, Any] | None = None, noop: bool = False,
              name: str = "QkanPack") -> Application:
    """A Ray Serve application serving the artifact at ``path`` (verified here first).

    Replicas load the artifact from the same absolute path (share it on every node, or copy
    it to that path on each) and refuse it unless its digest is the one verified here; a
    replica that cannot load it names its node (``ReplicaLoadError``).
    ``gpus_per_replica=1`` gives each replica a GPU of its own; fractions pack several
    replicas onto one GPU.
    """
    from ..runtime import read_artifact

    return app_for(read_artifact(path), options, predictor_options=predictor_options, noop=noop,
                   name=name)


def app_for(artifact: VerifiedArtifact, options: ServeOptions | None = None, *,
            predictor_options: Mapping[str, Any] | None = None, noop: bool = False,
            name: str = "QkanPack") -> Application:
    """``build_app`` for an artifact already read and verified (``serve_forever`` reads it
    once, before Ray starts, instead of hashing every file twice)."""
    # absolute: a relative path would be resolved in each replica's working directory,
    # which on a joined cluster is wherever that node's Ray was started
    return deployment_app(os.path.abspath(artifact.path), artifact.digest,
                          (options or ServeOptions()).for_artifact(artifact.manifest),
                          predictor_options=predictor_options, noop=noop, name=name)


def deployment_app(path: str, digest: str, options: ServeOptions, *,
                   predictor_options: Mapping[str, Any] | None = None, noop: bool = False,
                   name: str = "QkanPack") -> Application:
    """The deployment of the artifact at ``path`` (absolute), its replicas pinned to
    ``digest``, with ``options`` as ``ServeOptions.for_artifact`` made them."""
    from ray import serve

    deployment = serve.deployment(  # the decorator's form, as Ray's annotations state it
        name=name, num_replicas=options.replicas,
        ray_actor_options={"num_cpus": options.cpus_per_replica,
                           "num_gpus": options.gpus_per_replica},
        max_ongoing_requests=ray_ongoing_limit(options.limits), max_queued_requests=-1,
        health_check_period_s=2, health_check_timeout_s=30,
        graceful_shutdown_timeout_s=options.grace_s, graceful_shutdown_wait_loop_s=0.2,
    )(NoopServer if noop else ArtifactServer)
    if noop:
        return deployment.bind(options.limits.max_body_bytes)
    return deployment.bind(path, digest=digest, options=options,
                           predictor_options=predictor_options)
