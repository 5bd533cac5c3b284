"""A model repository's router: the Ray Serve application at ``/`` beside one application
per model version (``_routes``), which keeps the repository's state and answers what no
version does.

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
is ready and is then deleted; a version that fails its verification, its load or its
self-test leaves the serving one as it was, and the load answers the failure. Versions
whose directory is gone are unloaded. ``unload`` deletes every generation of the model.
Other models are never touched: each load and unload holds its model's lock only.

The router holds the state of the repository; it runs one replica (on the head node, next
to the command's work directory, where it records each version's HAProxy admission bounds:
``_routes.write_admission``), and neither batches nor computes.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RepositoryError
from ._app import deployment_app, tune_replica_process
from ._auth import CHALLENGE, UNAUTHORIZED_BODY, authorization, bearer_matches
from ._deploy import wait_running
from ._haproxy import admin_command
from ._http import BodyDeadline, json_response, raw_response, read_limited
from ._metrics import exposition, merge, replicas_of, repository_families, scrape_family
from ._oip import EXTENSIONS, PLATFORM
from ._oip_grpc import IMPLEMENTED, add_rpc_methods
from ._ray_compat import (
    HEAD_NODE_RESOURCE,
    delete_apps,
    deploy_without_waiting,
    haproxy_admin_socket,
)
from ._repository import Defaults, VersionPlan, model_names, plan_model, scan_model
from ._routes import Generation, publish_routes, write_admission

if TYPE_CHECKING:
    from ray.serve import Application
    from starlette.requests import Request
    from starlette.responses import Response

#: Each version's deployment (its application is the generation's: ``Generation.app``).
VERSION_DEPLOYMENT = "QkanPack"
#: Triton's model states (``RepositoryIndex``, ``GET /``).
READY, LOADING, UNLOADING, UNAVAILABLE = "READY", "LOADING", "UNLOADING", "UNAVAILABLE"
#: The repository extension, beside the protocol's own (``GET /v2``).
REPOSITORY_EXTENSION = "model_repository"
#: How long a load waits for a version's replicas.
LOAD_TIMEOUT_S = 900.0
#: How long one command to HAProxy's admin socket may take.
ADMIN_TIMEOUT_S = 2.0
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refusal:
    """A request the router answers itself: the HTTP status and what to say (the gRPC
    status follows from the HTTP one, ``GRPC_STATUS``)."""

    status: int
    message: str


#: Each refusal's gRPC status, by HTTP status.
GRPC_STATUS = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 503: "UNAVAILABLE",
               401: "UNAUTHENTICATED"}


@dataclass(frozen=True)
class Deployed:
    """A version deployed: its plan and the generation serving it."""

    plan: VersionPlan
    generation: Generation


@dataclass
class Version:
    """A version's state: what serves it (None: nothing), Triton's state name and why."""

    version: int
    serving: Deployed | None = None
    state: str = UNAVAILABLE
    reason: str = ""


class Repository:
    """The repository's state and its control (``load``, ``unload``): see the module
    docstring. Deploys from worker threads (Ray's deploy and status calls block)."""

    def __init__(self, root: str, defaults: Defaults, served: Sequence[tuple[VersionPlan, int]],
                 *, workdir: str | None = None, log_level: str = "WARNING") -> None:
        self.root = Path(root)
        self.defaults = defaults
        self.workdir = workdir
        self.log_level = log_level
        self.models: dict[str, dict[int, Version]] = {}
        self.loads: Counter[tuple[str, str, str]] = Counter()
        self._admission: dict[str, tuple[int, int, int]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: One deploy call at a time: Ray's deploy registers and unregisters a module for
        #: pickling by value around each call, and two at once fail ("not registered").
        self._deploying = asyncio.Lock()
        self._handles: dict[str, Any] = {}
        for plan, generation in served:
            deployed = Deployed(plan, Generation(plan.model, plan.version, generation))
            self.models.setdefault(plan.model, {})[plan.version] = Version(plan.version,
                                                                          deployed, READY)
            self._admission[deployed.generation.prefix] = admission_of(plan)
            self.loads[plan.model, str(plan.version), "success"] += 1
        self._generation = max((g for _, g in served), default=0)

    # -- what serves ------------------------------------------------------------------

    def ready_versions(self, name: str) -> list[int]:
        """The versions of ``name`` that serve (not those being unloaded), ascending."""
        return sorted(v for v, s in self.models.get(name, {}).items()
                      if s.state == READY and s.serving is not None)

    def single_model(self) -> str | None:
        """The one model the repository serves, if it serves exactly one (``POST /``)."""
        served = [n for n, versions in self.models.items()
                  if any(v.serving is not None for v in versions.values())]
        return served[0] if len(served) == 1 else None

    def resolve(self, name: str, version: str | None) -> Deployed | Refusal:
        """What serves ``name`` (``version``: a version's number as text; None or "": the
        highest ready one), or why nothing does (404: no such model or version; 503: not
        ready)."""
        versions = self.models.get(name)
        if not versions or all(s.state == UNAVAILABLE for s in versions.values()):
            if versions or name in self._on_disk():
                failed = "; ".join(f"{v}: {s.reason}" for v, s in sorted((versions or {}).items())
                                   if s.reason and s.reason != "unloaded")
                return Refusal(404, f"model {name!r} is not loaded"
                               + (f" (its last load failed: {failed})" if failed else "")
                               + f"; load it with POST /v2/repository/models/{name}/load")
            known = ", ".join(n for n in sorted(self.models) if self.ready_versions(n))
            return Refusal(404, f"unknown model {name!r}; this repository serves: "
                           f"{known or 'none'}")
        if version in (None, ""):
            ready = self.ready_versions(name)
            if not ready:
                return Refusal(503, f"model {name!r} has no ready version: "
                               + "; ".join(f"{v}: {s.state.lower()} {s.reason}".strip()
                                           for v, s in sorted(versions.items())))
            serving = versions[ready[-1]].serving
            assert serving is not None
            return serving
        state = versions.get(int(version)) if version.isdigit() else None
        if state is None:
            return Refusal(404, f"model {name!r} has no version {version!r}; it has "
                           f"{', '.join(map(str, sorted(versions)))}")
        if state.serving is None or state.state not in (READY, UNLOADING):
            return Refusal(503, f"version {version} of model {name!r} is "
                           f"{state.state.lower()}" + (f": {state.reason}" if state.reason else ""))
        return state.serving

    def handle(self, deployed: Deployed) -> Any:
        """The deployment handle of ``deployed``'s replicas (made once per generation)."""
        app = deployed.generation.app
        handle = self._handles.get(app)
        if handle is None:
            from ray import serve

            handle = serve.get_deployment_handle(VERSION_DEPLOYMENT, app, _check_exists=False)
            self._handles[app] = handle
        return handle

    def routes_choice(self) -> tuple[list[str], str | None]:
        """What HAProxy routes without a version (``_haproxy.model_routes``): each model's
        highest ready version's generation, and the one ``POST /`` goes to."""
        defaults = {}
        for name in self.models:
            ready = self.ready_versions(name)
            if ready:
                serving = self.models[name][ready[-1]].serving
                assert serving is not None
                defaults[name] = serving.generation.app
        single = self.single_model()
        return sorted(defaults.values()), defaults.get(single) if single else None

    async def publish_routes(self) -> None:
        """Tell HAProxy (its files, and the running one through its admin socket) where
        requests without a version go now. Best effort: where it fails, HAProxy sends
        them to the router, which passes them on to the same version."""
        if self.workdir is None:
            return
        commands = publish_routes(self.workdir, self.routes_choice())
        socket = haproxy_admin_socket()
        if socket is None or not os.path.exists(socket):
            return
        try:
            for command in commands:
                answer = await asyncio.wait_for(admin_command(socket, command), ADMIN_TIMEOUT_S)
                if answer.strip():
                    logger.warning("model repository: HAProxy said %r to %r", answer, command)
        except (OSError, asyncio.TimeoutError) as exc:
            logger.warning("model repository: HAProxy's routes not updated: %s", exc)

    def deployed(self) -> list[Deployed]:
        return [s.serving for versions in self.models.values() for s in versions.values()
                if s.serving is not None]

    def _on_disk(self) -> list[str]:
        try:
            return model_names(self.root)
        except OSError:
            return []

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: each model of the directory and each loaded one, with
        each version's state (a model never loaded, or unloaded, as one UNAVAILABLE entry)."""
        entries = []
        for name in sorted({*self._on_disk(), *self.models}):
            versions = self.models.get(name)
            if not versions:
                entries.append({"name": name, "version": "", "state": UNAVAILABLE,
                                "reason": "unloaded"})
                continue
            entries += [{"name": name, "version": str(v), "state": s.state, "reason": s.reason}
                        for v, s in sorted(versions.items())]
        return [e for e in entries if e["state"] == READY] if ready_only else entries

    # -- control ----------------------------------------------------------------------

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def load(self, name: str) -> Refusal | None:
        """Load (or reload) model ``name`` from its directory (see the module docstring):
        None when every version serves as its directory says, else the refusal (404: no
        such model; 400: what failed, the versions that could serve serving)."""
        async with self._lock(name):
            if name not in self._on_disk():
                return Refusal(404, f"no model {name!r} in the repository {self.root}")
            try:
                model = await asyncio.to_thread(scan_model, self.root, name)
            except RepositoryError as exc:
                return Refusal(400, f"cannot load {name!r}: {exc}")
            plans, problems = await asyncio.to_thread(plan_model, model, self.defaults)
            versions = self.models.setdefault(name, {})
            for version, problem in problems:
                self._failed(name, version, problem)
            failures = [problem for _, problem in problems]
            failures += [f for f in await asyncio.gather(*map(self._deploy, plans)) if f]
            on_disk = {v.version for v in model.versions}
            await self._undeploy(name, [v for v in versions if v not in on_disk], forget=True)
            await self.publish_routes()
        if failures:
            return Refusal(400, f"model {name!r}: " + "; ".join(failures))
        return None

    def _failed(self, name: str, version: int | None, problem: str) -> None:
        """Record a version that cannot load (None: every version of ``name``): counted, and
        unavailable unless a generation of it serves (which keeps serving)."""
        versions = self.models.setdefault(name, {})
        for number in ([version] if version is not None else list(versions)):
            state = versions.setdefault(number, Version(number))
            self.loads[name, str(number), "failure"] += 1
            if state.serving is None:
                state.state, state.reason = UNAVAILABLE, problem
            else:
                state.reason = f"serving the earlier load; the last load failed: {problem}"

    async def _deploy(self, plan: VersionPlan) -> str | None:
        """Deploy ``plan`` as a new generation unless the serving one is the same; None on
        success (the old generation then deleted), else what failed (the old one kept)."""
        versions = self.models.setdefault(plan.model, {})
        state = versions.setdefault(plan.version, Version(plan.version))
        if state.serving is not None and state.serving.plan.key == plan.key:
            state.reason = ""
            return None
        self._generation += 1
        generation = Generation(plan.model, plan.version, self._generation)
        if state.serving is None:
            state.state, state.reason = LOADING, ""
        self._admission[generation.prefix] = admission_of(plan)
        try:
            self._record_admission()
            async with self._deploying:
                await asyncio.to_thread(start_version, plan, generation, self.log_level)
            await asyncio.to_thread(wait_running, [generation.app], LOAD_TIMEOUT_S,
                                    label=lambda _: f"generation {generation.generation}")
        except Exception as exc:  # ServeError: its load failed; anything else: Ray's
            problem = f"{plan.label}: {exc}"
            logger.warning("model repository: %s", problem)
            await asyncio.to_thread(_delete, [generation.app])
            self._admission.pop(generation.prefix, None)
            self._failed(plan.model, plan.version, str(exc))
            return problem
        old, state.serving = state.serving, Deployed(plan, generation)
        state.state, state.reason = READY, ""
        self.loads[plan.model, str(plan.version), "success"] += 1
        if old is not None:
            await self.publish_routes()  # the default moves to the new generation first
            await self._delete_generations([old])
        return None

    async def unload(self, name: str) -> Refusal | None:
        """Unload every version of ``name`` (None: done, or nothing was loaded; 404: no such
        model, loaded or in the directory)."""
        async with self._lock(name):
            if name not in self.models and name not in self._on_disk():
                return Refusal(404, f"unknown model {name!r}")
            await self._undeploy(name, list(self.models.get(name, {})), forget=False)
            await self.publish_routes()
        return None

    async def _undeploy(self, name: str, numbers: Sequence[int], *, forget: bool) -> None:
        versions = self.models.get(name, {})
        gone = [versions[n] for n in numbers if n in versions]
        serving = [s.serving for s in gone if s.serving is not None]
        for state in gone:
            state.state = UNLOADING if state.serving is not None else state.state
        await self.publish_routes()  # HAProxy stops sending requests to what is leaving
        await self._delete_generations(serving)
        for state in gone:
            state.serving, state.state, state.reason = None, UNAVAILABLE, "unloaded"
            if forget:
                del versions[state.version]

    async def _delete_generations(self, generations: Sequence[Deployed]) -> None:
        if not generations:
            return
        await asyncio.to_thread(_delete, [d.generation.app for d in generations])
        for deployed in generations:
            self._handles.pop(deployed.generation.app, None)
            self._admission.pop(deployed.generation.prefix, None)
        self._record_admission()

    def _record_admission(self) -> None:
        if self.workdir is not None:
            write_admission(self.workdir, self._admission)


def admission_of(plan: VersionPlan) -> tuple[int, int, int]:
    """A version's admission bounds as HAProxy applies them (at work, waiting, Retry-After):
    its options made them whole (``ServeOptions.for_artifact``)."""
    limits = plan.options.limits
    ongoing, queued = limits.admission_bounds(plan.options.max_batch_size or 1)
    return ongoing, queued, limits.retry_after_s


def start_version(plan: VersionPlan, generation: Generation, log_level: str) -> None:
    """Deploy ``generation`` of ``plan``: its own application, at its route prefix, its
    replicas pinned to the digest verified (without waiting for them)."""
    app = deployment_app(plan.path, plan.digest, plan.options,
                         predictor_options=plan.predictor_options, name=VERSION_DEPLOYMENT)
    deploy_without_waiting(app, generation.app, {"enable_access_log": False,
                                                 "log_level": log_level},
                           route_prefix=generation.prefix)



def _delete(apps: Sequence[str]) -> None:
    try:
        delete_apps(apps)
    except Exception as exc:  # a timeout: Ray goes on deleting them
        logger.warning("model repository: deleting %s: %s", ", ".join(apps), exc)


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
        self.refusals["not_found" if refusal.status == 404 else
                      "unavailable" if refusal.status == 503 else "client_error"] += 1
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

    async def _forward(self, request: Request, target: Deployed, path: str) -> Response:
        body = await self._body(request)
        if not isinstance(body, bytes):
            return body
        status, headers, payload = await self.repository.handle(target).forward_http.remote(
            request.method, path, list(request.scope.get("headers", ())), body)
        reply = raw_response(status, payload)
        reply.raw_headers = headers
        return reply

    async def _model_metadata(self, request: Request, name: str, path: str) -> Response:
        """``GET /v2/models/<name>``: the highest ready version's metadata, listing every
        ready version (Triton's answer)."""
        target = self.repository.resolve(name, None)
        if isinstance(target, Refusal):
            return self._refuse(target)
        status, _, payload = await self.repository.handle(target).forward_http.remote(
            "GET", path, list(request.scope.get("headers", ())), b"")
        if status != 200:
            return raw_response(status, payload)
        import orjson

        metadata = orjson.loads(payload)
        metadata["versions"] = [str(v) for v in self.repository.ready_versions(name)]
        return json_response(200, metadata)

    async def _root_predict(self, request: Request) -> Response:
        name = self.repository.single_model()
        if name is None:
            names = sorted(self.repository.models)
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
        ready = all(self.repository.ready_versions(n) for n in self.repository.models
                    if any(v.state != UNAVAILABLE or v.reason != "unloaded"
                           for v in self.repository.models[n].values()))
        return json_response(200 if ready else 400, {"ready": ready})

    async def _index(self, request: Request) -> Response:
        body = await self._body(request)
        if not isinstance(body, bytes):
            return body
        ready = index_ready_only(body)
        if isinstance(ready, Refusal):
            return self._refuse(ready)
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
    if not body.strip():
        return {}
    import orjson

    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return Refusal(400, f"the body is not JSON: {exc}")
    return data if isinstance(data, dict) else Refusal(400, "the body is not a JSON object")


def index_ready_only(body: bytes) -> bool | Refusal:
    """The index request's ``ready`` flag (Triton's ``{"ready": true}``: ready ones only)."""
    data = _json_object(body)
    if isinstance(data, Refusal):
        return data
    ready = data.get("ready", False)
    return ready if isinstance(ready, bool) else Refusal(400, '"ready" is true or false')


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
                 server_version: str) -> None:
        from ._oip_grpc import protocol

        self.repository = repository
        self.token_sha256 = token_sha256
        self.server_version = server_version
        self.pb = protocol()

    async def answer(self, rpc: str, request: Any, context: Any) -> Any:
        metadata = tuple((m.key, m.value) if hasattr(m, "key") else tuple(m)
                         for m in (context.invocation_metadata() if context is not None else ()))
        if self.token_sha256 is not None and not any(
                k.lower() == "authorization" and bearer_matches(
                    (v.decode("latin-1") if isinstance(v, bytes) else v).encode("latin-1"),
                    self.token_sha256) for k, v in metadata):
            return _status(context, "UNAUTHENTICATED", "missing or wrong bearer token: send "
                           "metadata 'authorization: Bearer <token>'", None)
        reply = getattr(self.pb, f"{rpc}Response", None)
        if rpc in ("ServerLive", "ServerReady"):
            return reply(**{rpc.removeprefix("Server").lower(): True})
        if rpc == "ServerMetadata":
            meta = server_metadata(self.server_version)
            return reply(name=meta["name"], version=meta["version"],
                         extensions=meta["extensions"])
        if rpc == "RepositoryIndex":
            return reply(models=[self.pb.RepositoryIndexResponse.ModelIndex(**e)
                                 for e in self.repository.index(request.ready)])
        if rpc in ("RepositoryModelLoad", "RepositoryModelUnload"):
            return await self._control(rpc, request, context, reply)
        if rpc in IMPLEMENTED:  # a model's RPC
            return await self._model_rpc(rpc, request, context, metadata)
        return _status(context, "UNIMPLEMENTED", f"{rpc} is not served by qkan-pack", None)

    async def _control(self, rpc: str, request: Any, context: Any, reply: Any) -> Any:
        unsupported = sorted(k for k in request.parameters if k != "unload_dependents")
        if unsupported:
            return _status(context, "INVALID_ARGUMENT", f"parameters {unsupported} are not "
                           "supported: a model's settings are its qkan-pack.toml", reply())
        name = request.model_name
        refusal = await (self.repository.load(name) if rpc == "RepositoryModelLoad"
                         else self.repository.unload(name))
        if refusal is not None:
            return _status(context, GRPC_STATUS.get(refusal.status, "INTERNAL"),
                           refusal.message, reply())
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
            return _status(context, GRPC_STATUS.get(target.status, "INTERNAL"), target.message,
                           reply())
        answer, code, details = await self.repository.handle(target).forward_grpc.remote(
            rpc, request, metadata)
        if code not in (None, "OK"):
            return _status(context, code, details, answer)
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
                 *, token_sha256: str | None = None, workdir: str | None = None,
                 log_level: str = "WARNING", max_body_bytes: int = 8 * 2**20,
                 body_timeout_s: float = 30.0) -> None:
        from .._version import __version__

        tune_replica_process()
        self.repository = Repository(root, defaults, served, workdir=workdir,
                                     log_level=log_level)
        self._token_sha256 = token_sha256
        self._server_version = __version__
        self.http = RouterHttp(self.repository, token_sha256, max_body_bytes=max_body_bytes,
                               body_timeout_s=body_timeout_s, server_version=__version__,
                               scrape=self.scrape, stats=self.stats)
        self._grpc: RouterGrpc | None = None
        if defaults.options.grpc:
            _ = self.grpc  # the stubs, registered for unpickling requests, before any arrives

    async def __call__(self, request: Request) -> Response:
        return await self.http.handle(request)

    @property
    def grpc(self) -> RouterGrpc:
        if self._grpc is None:
            self._grpc = RouterGrpc(self.repository, self._token_sha256, self._server_version)
        return self._grpc

    async def scrape(self) -> tuple[bytes, str]:
        """``GET /metrics``: every version's replicas (labelled by model and version), the
        repository's own counts."""
        handles = [self.repository.handle(d) for d in self.repository.deployed()]
        parts, answered, failed = await replicas_of(handles, "metric_families")
        own = repository_families(self.repository.loads, {
            (n, str(v)): s.state for n, vs in self.repository.models.items()
            for v, s in vs.items()}, self.http.refusals)
        return exposition([*merge([own, *parts]), scrape_family(answered, failed)])

    async def stats(self, reset: bool) -> dict[str, Any]:
        """``GET /stats``: each version's replicas' counters."""
        deployed = self.repository.deployed()
        answers = await asyncio.gather(*(replicas_of([self.repository.handle(d)], "stats", reset,
                                                     answer=dict) for d in deployed))
        return {"models": [{"model": d.plan.model, "version": str(d.plan.version),
                            "replicas": parts} for d, (parts, _, _) in zip(deployed, answers)]}


add_rpc_methods(RepositoryServer)  # Ray Serve calls the method named after each RPC


def router_app(root: str, defaults: Defaults, served: Sequence[tuple[VersionPlan, int]], *,
               token_sha256: str | None, workdir: str | None, log_level: str,
               max_body_bytes: int, body_timeout_s: float, head_only: bool) -> Application:
    """The router's application: one replica, no CPU of its own (it neither batches nor
    computes), on the head node where the command's work directory is (``head_only``, on a
    joined cluster)."""
    from ray import serve

    deployment = serve.deployment(
        RepositoryServer, name="Repository", num_replicas=1,
        ray_actor_options={"num_cpus": 0, **({"resources": {HEAD_NODE_RESOURCE: 0.001}}
                                             if head_only else {})},
        max_ongoing_requests=10_000, max_queued_requests=-1, health_check_period_s=2,
        graceful_shutdown_timeout_s=5, graceful_shutdown_wait_loop_s=0.2)
    return deployment.bind(root, defaults, list(served), token_sha256=token_sha256,
                           workdir=workdir, log_level=log_level, max_body_bytes=max_body_bytes,
                           body_timeout_s=body_timeout_s)
