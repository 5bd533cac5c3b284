"""A model repository's router: the Ray Serve application at ``/`` beside one application
per model version (``_routes``), which keeps the repository's state (``_versions``) and
answers what no version does.

How requests find a version. Through HAProxy (the default ingress) a model's requests go
straight to its version's replicas: the config rewrite routes them by path
(``_haproxy.model_routes``), with no hop through this router, so a model in a repository
is served as fast as one served alone. What reaches the router:

- ``GET /`` (the models and their versions), ``/v2``, ``/v2/health/...``, ``GET /metrics``
  (every version's replicas, labelled by model and version, and the repository's own
  counts), ``GET /stats``;
- Triton's repository extension: ``POST /v2/repository/index``,
  ``POST /v2/repository/models/<name>/load`` and ``/unload``;
- ``GET /v2/models/<name>`` (the model's metadata: every ready version);
- requests for a name or version that does not serve (404, or 503 while it loads), and
  those HAProxy could not route (a version whose replicas are all down);
- every model request through Ray's Python proxy (``--ingress python``), and every gRPC
  call (tritonclient's carry no application to route by): the router passes each on to
  the version's replicas over its deployment handle (``forward_http``, ``forward_grpc``),
  one more hop.

Versions (Triton's semantics): every version directory serves; a request without a version
goes to the highest ready one. ``load`` reads the model's directory again: each version is
verified and planned (``_repository``); a new or changed one (new bytes or settings) is
deployed as a new generation beside the one serving, which keeps serving until the new one
is ready and is then deleted, one version at a time, each first held to what the cluster
has left; a version that fails its verification, its load or its self-test leaves the
serving one as it was, and the load answers the failure. Versions whose directory is gone
are unloaded, and so is a model whose directory is gone. ``unload`` deletes every
generation of the model.
Other models are never touched: each load and unload holds its model's lock only.

The router holds the state of the repository; it runs one replica (on the head node, next
to the command's work directory, where it records each version's HAProxy admission bounds:
``_routes.write_admission``), and neither batches nor computes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._app import tune_replica_process
from ._auth import CHALLENGE, UNAUTHORIZED_BODY, authorization, bearer_matches
from ._http import BodyDeadline, HttpLimits, read_limited
from ._http_replies import json_response, method_not_allowed, raw_response
from ._metrics import exposition, merge, replicas_of, repository_families, scrape_family
from ._oip import EXTENSIONS, PLATFORM, REPOSITORY_EXTENSION, control_body, ready_only
from ._oip_grpc import IMPLEMENTED, add_rpc_methods
from ._ray_compat import HEAD_NODE_RESOURCE
from ._repository import Defaults, VersionPlan
from ._statistics import statistics_message
from ._versions import Deployed, Refusal, Repository

if TYPE_CHECKING:
    from ray.serve import Application
    from starlette.requests import Request
    from starlette.responses import Response

#: Each refusal's gRPC status, by HTTP status.
GRPC_STATUS = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 503: "UNAVAILABLE",
               401: "UNAUTHENTICATED"}
#: Each refusal's outcome in ``qkan_pack_repository_refusals_total``, by HTTP status and by
#: gRPC status.
REFUSAL_OUTCOME: dict[int | str, str] = {
    404: "not_found", "NOT_FOUND": "not_found", 503: "unavailable", "UNAVAILABLE": "unavailable",
    401: "unauthorized", "UNAUTHENTICATED": "unauthorized"}  # anything else: client_error

# -- the router's HTTP API -------------------------------------------------------------


class RouterHttp:
    """The router's routes (see the module docstring); every reply is JSON."""

    def __init__(self, repository: Repository, token_sha256: str | None, *,
                 max_body_bytes: int, body_timeout_s: float, server_version: str,
                 scrape: Callable[[], Awaitable[tuple[bytes, str]]],
                 stats: Callable[[bool], Awaitable[dict[str, Any]]]) -> None:
        self.repository = repository
        self.token_sha256 = token_sha256
        self.max_body_bytes = max_body_bytes
        self.server_version = server_version
        self.refusals: Counter[str] = Counter()
        self._deadline = BodyDeadline(body_timeout_s)
        self._scrape = scrape
        self._stats = stats

    async def handle(self, request: Request) -> Response:
        scope = request.scope
        path = scope["path"].removeprefix(scope.get("root_path", "")).rstrip("/")
        method = request.method
        if self.token_sha256 is not None and not bearer_matches(authorization(scope),
                                                                self.token_sha256):
            self.refusals["unauthorized"] += 1
            return raw_response(401, UNAUTHORIZED_BODY, {"WWW-Authenticate": CHALLENGE})
        parts = path.split("/")[1:]
        if parts == ["v2", "models", "stats"] or (parts[:2] == ["v2", "models"]
                                                  and parts[3:] == ["stats"]):
            return await self._statistics(request, path, None if len(parts) == 3 else parts[2])
        if parts[:2] == ["v2", "models"] and len(parts) >= 3:
            return await self._model_route(request, parts[2], parts[3:], path)
        if parts[:1] == ["models"] and len(parts) >= 2:
            return await self._model_route(request, parts[1], parts[2:], path)
        if parts[:3] == ["v2", "repository", "models"] and len(parts) == 5 \
                and parts[4] in ("load", "unload"):
            return await self._control(request, parts[3], parts[4])
        handler = self._fixed.get((path, "GET" if method == "HEAD" else method))
        if handler is not None:
            return await handler(request)
        if path == "" and method == "POST":
            return await self._root_predict(request)
        if any(p == path for p, _ in self._fixed):
            allowed = sorted({m for p, m in self._fixed if p == path})
            return json_response(405, {"error": f"{method} is not allowed on {path or '/'}; "
                                       f"use {', '.join(allowed)}"}, {"Allow": ", ".join(allowed)})
        return self._refuse(Refusal(404, f"no route {path!r}; use GET /, POST /models/<name>, "
                                    "/v2/models/<name>/..., /v2/repository/..., GET /metrics"))

    @property
    def _fixed(self) -> dict[tuple[str, str], Callable[[Request], Awaitable[Response]]]:
        return {("", "GET"): self._listing, ("/v2", "GET"): self._server_metadata,
                ("/v2/health/live", "GET"): self._live, ("/v2/health/ready", "GET"): self._ready,
                ("/v2/repository/index", "POST"): self._index, ("/metrics", "GET"): self._metrics,
                ("/stats", "GET"): self._get_stats, ("/stats/reset", "POST"): self._reset_stats}

    def _refuse(self, refusal: Refusal) -> Response:
        self.refusals[REFUSAL_OUTCOME.get(refusal.status, "client_error")] += 1
        headers = {"Retry-After": "1"} if refusal.status == 503 else None
        return json_response(refusal.status, {"error": refusal.message}, headers)

    async def _body(self, request: Request) -> bytes | Response:
        try:
            body = await self._deadline.read(read_limited(request, self.max_body_bytes))
        except asyncio.TimeoutError:
            return json_response(408, {"error": "request body not received in time"})
        if body is None:
            return json_response(413, {"error": f"request body exceeds {self.max_body_bytes} "
                                       "bytes"})
        return body

    async def _model_route(self, request: Request, name: str, rest: list[str],
                           path: str) -> Response:
        """A model's route: passed on to the version that serves it."""
        version = None
        if rest[:1] == ["versions"]:
            if len(rest) < 2:
                return self._refuse(Refusal(404, f"no route {path!r}: name a version "
                                            f"(.../versions/<version>)"))
            version = rest[1]
        if rest == [] and path.startswith("/v2/") and request.method in ("GET", "HEAD"):
            return await self._model_metadata(request, name, path)
        target = self.repository.resolve(name, version)
        if isinstance(target, Refusal):
            if rest[-1:] == ["ready"] and target.status == 503:  # the protocol: 4xx is "no"
                return json_response(400, {"name": name, "ready": False,
                                           "error": target.message})
            return self._refuse(target)
        return await self._forward(request, target, path)

    async def _statistics(self, request: Request, path: str, name: str | None) -> Response:
        """Triton's statistics extension over every ready version (of model ``name``); one
        version's (``.../versions/<v>/stats``) is its replicas' own answer."""
        if request.method not in ("GET", "HEAD"):
            return method_not_allowed(request.method, path, "GET")
        stats = await self.repository.statistics(name)
        if isinstance(stats, Refusal):
            return self._refuse(stats)
        return json_response(200, {"model_stats": stats})

    async def _forward(self, request: Request, target: Deployed, path: str) -> Response:
        body = await self._body(request)
        if not isinstance(body, bytes):
            return body
        answer = await self.repository.call(target, "forward_http", request.method, path,
                                            list(request.scope.get("headers", ())), body)
        if isinstance(answer, Refusal):
            return self._refuse(answer)
        status, headers, payload = answer
        reply = raw_response(status, payload)
        reply.raw_headers = headers
        return reply

    async def _model_metadata(self, request: Request, name: str, path: str) -> Response:
        """``GET /v2/models/<name>``: the highest ready version's metadata, listing every
        ready version (Triton's answer)."""
        target = self.repository.resolve(name, None)
        if isinstance(target, Refusal):
            return self._refuse(target)
        answer = await self.repository.call(target, "forward_http", "GET", path,
                                            list(request.scope.get("headers", ())), b"")
        if isinstance(answer, Refusal):
            return self._refuse(answer)
        status, _, payload = answer
        if status != 200:
            return raw_response(status, payload)
        import orjson

        metadata = orjson.loads(payload)
        metadata["versions"] = [str(v) for v in self.repository.ready_versions(name)]
        return json_response(200, metadata)

    async def _root_predict(self, request: Request) -> Response:
        name = self.repository.single_model()
        if name is None:
            names = self.repository.served_models()  # not those unloaded, or never loaded
            return self._refuse(Refusal(404, "POST / predicts when the repository serves one "
                                        f"model; it serves {len(names)}: POST /models/<name> "
                                        f"({', '.join(names) or 'none loaded'})"))
        target = self.repository.resolve(name, None)
        if isinstance(target, Refusal):
            return self._refuse(target)
        return await self._forward(request, target, "/")

    async def _control(self, request: Request, name: str, action: str) -> Response:
        if request.method != "POST":
            return json_response(405, {"error": f"{request.method} is not allowed on "
                                       f"/v2/repository/models/{name}/{action}; use POST"},
                                 {"Allow": "POST"})
        body = await self._body(request)
        if not isinstance(body, bytes):
            return body
        refusal = unsupported_parameters(body)
        if refusal is None:
            refusal = await (self.repository.load(name) if action == "load"
                             else self.repository.unload(name))
        return self._refuse(refusal) if refusal is not None else json_response(200, {})

    async def _listing(self, request: Request) -> Response:
        return json_response(200, listing(self.repository))

    async def _server_metadata(self, request: Request) -> Response:
        return json_response(200, server_metadata(self.server_version))

    async def _live(self, request: Request) -> Response:
        return json_response(200, {"live": True})

    async def _ready(self, request: Request) -> Response:
        await self.repository.fresh_health()
        ready = self.repository.server_ready()
        return json_response(200 if ready else 400, {"ready": ready})

    async def _index(self, request: Request) -> Response:
        body = await self._body(request)
        if not isinstance(body, bytes):
            return body
        ready = index_ready_only(body)
        if isinstance(ready, Refusal):
            return self._refuse(ready)
        await self.repository.fresh_health()
        return json_response(200, self.repository.index(ready))

    async def _metrics(self, request: Request) -> Response:
        payload, content_type = await self._scrape()
        reply = raw_response(200, payload)
        reply.raw_headers[1] = (b"content-type", content_type.encode("latin-1"))
        return reply

    async def _get_stats(self, request: Request) -> Response:
        return json_response(200, await self._stats(False))

    async def _reset_stats(self, request: Request) -> Response:
        return json_response(200, await self._stats(True))


def listing(repository: Repository) -> dict[str, Any]:
    """``GET /``: the repository, each model's versions and which one answers by default."""
    models = []
    for name in sorted({*repository._on_disk(), *repository.models}):
        versions = repository.models.get(name, {})
        ready = repository.ready_versions(name)
        models.append({
            "name": name, "default_version": str(ready[-1]) if ready else None,
            "versions": [{"version": str(v), "state": s.state, "reason": s.reason,
                          **({"digest": s.serving.plan.digest} if s.serving else {})}
                         for v, s in sorted(versions.items())],
            "routes": {"json": f"/models/{name}", "oip": f"/v2/models/{name}"},
        })
    return {"repository": str(repository.root), "models": models,
            "single_model": repository.single_model()}


def server_metadata(version: str) -> dict[str, Any]:
    return {"name": PLATFORM, "version": version,
            "extensions": [*EXTENSIONS, REPOSITORY_EXTENSION]}


def _json_object(body: bytes) -> dict[str, Any] | Refusal:
    data = control_body(body)
    return Refusal(400, data) if isinstance(data, str) else data


def index_ready_only(body: bytes) -> bool | Refusal:
    """The index request's ``ready`` flag (``_oip.ready_only``), or its 400."""
    ready = ready_only(body)
    return Refusal(400, ready) if isinstance(ready, str) else ready


def unsupported_parameters(body: bytes) -> Refusal | None:
    """A load or unload request's parameters: Triton's ``unload_dependents`` is accepted (a
    model here has none); a ``config`` override or model files sent with the request are
    refused (a model's settings are its ``qkan-pack.toml``, its files its directory's)."""
    data = _json_object(body)
    if isinstance(data, Refusal):
        return data
    parameters = data.get("parameters", {})
    if not isinstance(parameters, dict):
        return Refusal(400, '"parameters" is a JSON object')
    unsupported = sorted(k for k in parameters if k != "unload_dependents")
    if unsupported:
        return Refusal(400, f"parameters {unsupported} are not supported: a model's settings "
                       "are its qkan-pack.toml and its versions its directories; edit them "
                       "and load again")
    return None


# -- the router's gRPC API ------------------------------------------------------------


class RouterGrpc:
    """The router's answers to ``inference.GRPCInferenceService``: the server's own RPCs
    and the repository's here, a model's passed on to its version's replicas."""

    def __init__(self, repository: Repository, token_sha256: str | None,
                 server_version: str, refusals: Counter[str] | None = None) -> None:
        """``refusals``: where the calls it refuses are counted (the HTTP routes' counter:
        ``qkan_pack_repository_refusals_total`` counts both)."""
        from ._oip_grpc import protocol

        self.repository = repository
        self.token_sha256 = token_sha256
        self.server_version = server_version
        self.refusals: Counter[str] = Counter() if refusals is None else refusals
        self.pb = protocol()

    def _refuse(self, context: Any, code: str, details: str, reply: Any) -> Any:
        self.refusals[REFUSAL_OUTCOME.get(code, "client_error")] += 1
        return _status(context, code, details, reply)

    async def answer(self, rpc: str, request: Any, context: Any) -> Any:
        """One RPC; a refusal is the RPC's empty reply with its status set (never None: Ray's
        Python gRPC proxy serialises whatever is returned)."""
        metadata = tuple((m.key, m.value) if hasattr(m, "key") else tuple(m)
                         for m in (context.invocation_metadata() if context is not None else ()))
        reply: Any = getattr(self.pb, f"{rpc}Response")
        if self.token_sha256 is not None and not any(
                k.lower() == "authorization" and bearer_matches(
                    (v.decode("latin-1") if isinstance(v, bytes) else v).encode("latin-1"),
                    self.token_sha256) for k, v in metadata):
            return self._refuse(context, "UNAUTHENTICATED", "missing or wrong bearer token: "
                                "send metadata 'authorization: Bearer <token>'", reply())
        if rpc == "ServerLive":
            return reply(live=True)
        if rpc == "ServerReady":
            await self.repository.fresh_health()
            return reply(ready=self.repository.server_ready())
        if rpc == "ServerMetadata":
            meta = server_metadata(self.server_version)
            return reply(name=meta["name"], version=meta["version"],
                         extensions=meta["extensions"])
        if rpc == "RepositoryIndex":
            await self.repository.fresh_health()
            return reply(models=[self.pb.RepositoryIndexResponse.ModelIndex(**e)
                                 for e in self.repository.index(request.ready)])
        if rpc in ("RepositoryModelLoad", "RepositoryModelUnload"):
            return await self._control(rpc, request, context, reply)
        if rpc == "ModelStatistics" and not request.version:  # every version (of a model)
            stats = await self.repository.statistics(request.name or None)
            if isinstance(stats, Refusal):
                return self._refuse(context, GRPC_STATUS[stats.status], stats.message, reply())
            return statistics_message(self.pb, stats)
        if rpc in IMPLEMENTED:  # a model's RPC
            return await self._model_rpc(rpc, request, context, metadata)
        return self._refuse(context, "UNIMPLEMENTED", f"{rpc} is not served by qkan-pack",
                            reply())

    async def _control(self, rpc: str, request: Any, context: Any, reply: Any) -> Any:
        unsupported = sorted(k for k in request.parameters if k != "unload_dependents")
        if unsupported:
            return self._refuse(context, "INVALID_ARGUMENT", f"parameters {unsupported} are "
                                "not supported: a model's settings are its qkan-pack.toml",
                                reply())
        name = request.model_name
        refusal = await (self.repository.load(name) if rpc == "RepositoryModelLoad"
                         else self.repository.unload(name))
        if refusal is not None:
            return self._refuse(context, GRPC_STATUS[refusal.status], refusal.message, reply())
        return reply()

    async def _model_rpc(self, rpc: str, request: Any, context: Any,
                         metadata: tuple[tuple[str, str], ...]) -> Any:
        reply = getattr(self.pb, f"{rpc}Response")
        name, version = ((request.model_name, request.model_version) if rpc == "ModelInfer"
                         else (request.name, request.version))
        target = self.repository.resolve(name, version)
        if isinstance(target, Refusal):
            if rpc == "ModelReady":
                return reply(ready=False)
            return self._refuse(context, GRPC_STATUS[target.status], target.message, reply())
        forwarded = await self.repository.call(target, "forward_grpc", rpc, request, metadata)
        if isinstance(forwarded, Refusal):
            return self._refuse(context, GRPC_STATUS[forwarded.status], forwarded.message, reply())
        answer, code, details, trailing = forwarded
        if code not in (None, "OK"):
            if trailing and context is not None:  # the replica's pushback, say
                context.set_trailing_metadata(trailing)
            return _status(context, code, details, answer)  # the replica's
        if rpc == "ModelMetadata" and not version:
            del answer.versions[:]
            answer.versions.extend(str(v) for v in self.repository.ready_versions(name))
        return answer


def _status(context: Any, code: str, details: str, reply: Any) -> Any:
    import grpc

    if context is not None:
        context.set_code(getattr(grpc.StatusCode, code))
        context.set_details(details)
    return reply


# -- the router's deployment ----------------------------------------------------------


class RepositoryServer:
    """Ray Serve replica body of the repository's router (``router_app``)."""

    def __init__(self, root: str, defaults: Defaults, served: Sequence[tuple[VersionPlan, int]],
                 *, limits: HttpLimits | None = None, workdir: str | None = None,
                 log_level: str = "WARNING") -> None:
        """``limits``: the router's own (its token, the largest body any version takes, the
        body timeout); its admission is each version's, not the router's."""
        from .._version import __version__

        tune_replica_process()
        self.repository = Repository(root, defaults, served, workdir=workdir,
                                     log_level=log_level, watch=True)
        limits = limits or HttpLimits()
        self._token_sha256 = limits.token_sha256
        self._server_version = __version__
        self.http = RouterHttp(self.repository, limits.token_sha256,
                               max_body_bytes=limits.max_body_bytes,
                               body_timeout_s=limits.body_timeout_s, server_version=__version__,
                               scrape=self.scrape, stats=self.stats)
        self._grpc: RouterGrpc | None = None
        if defaults.options.grpc:
            _ = self.grpc  # the stubs, registered for unpickling requests, before any arrives

    async def __call__(self, request: Request) -> Response:
        return await self.http.handle(request)

    @property
    def grpc(self) -> RouterGrpc:
        if self._grpc is None:
            self._grpc = RouterGrpc(self.repository, self._token_sha256, self._server_version,
                                    self.http.refusals)
        return self._grpc

    async def scrape(self) -> tuple[bytes, str]:
        """``GET /metrics``: every version's replicas (labelled by model and version), the
        repository's own counts."""
        handles = [self.repository.handle(d) for d in self.repository.deployed()]
        parts, answered, failed = await replicas_of(handles, "metric_families")
        own = repository_families(self.repository.loads, {
            (n, str(v)): self.repository.state_of(s)[0]
            for n, vs in self.repository.models.items() for v, s in vs.items()},
            self.http.refusals)
        return exposition([*merge([own, *parts]), scrape_family(answered, failed)])

    async def ModelStreamInfer(self, requests: Any,  # named as the RPC
                               grpc_context: Any = None) -> AsyncIterator[Any]:
        """``ModelStreamInfer`` (bidirectional streaming) is not served: the call ends with
        no message, ``UNAUTHENTICATED`` without the token, else ``UNIMPLEMENTED``. Without
        this method Ray's proxy answered ``UNKNOWN`` naming the router's own methods,
        token or not."""
        await self.grpc.answer("ModelStreamInfer", None, grpc_context)  # sets the status
        return
        yield  # an async generator: Ray Serve streams what it yields (nothing)

    async def stats(self, reset: bool) -> dict[str, Any]:
        """``GET /stats``: each version's replicas' counters."""
        deployed = self.repository.deployed()
        answers = await asyncio.gather(*(replicas_of([self.repository.handle(d)], "stats", reset,
                                                     answer=dict) for d in deployed))
        return {"models": [{"model": d.plan.model, "version": str(d.plan.version),
                            "replicas": parts} for d, (parts, _, _) in zip(deployed, answers)]}


add_rpc_methods(RepositoryServer)  # Ray Serve calls the method named after each RPC


def router_app(root: str, defaults: Defaults, served: Sequence[tuple[VersionPlan, int]], *,
               limits: HttpLimits, workdir: str | None, log_level: str,
               head_only: bool) -> Application:
    """The router's application: one replica, no CPU of its own (it neither batches nor
    computes), on the head node where the command's work directory is (``head_only``, on a
    joined cluster)."""
    from ray import serve

    deployment = serve.deployment(  # the decorator's form, as Ray's annotations state it
        name="Repository", num_replicas=1,
        ray_actor_options={"num_cpus": 0, **({"resources": {HEAD_NODE_RESOURCE: 0.001}}
                                             if head_only else {})},
        max_ongoing_requests=10_000, max_queued_requests=-1, health_check_period_s=2,
        graceful_shutdown_timeout_s=5, graceful_shutdown_wait_loop_s=0.2)(RepositoryServer)
    return deployment.bind(root, defaults, list(served), limits=limits, workdir=workdir,
                           log_level=log_level)
