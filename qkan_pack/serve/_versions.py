"""A model repository's versions as the router keeps them: what serves each version (its
deployed generation), Triton's state names, and the control that changes them (``load``,
``unload``); see ``_router``'s docstring for the semantics. The router (``_router``) answers
requests from this state; ``serve_forever`` deploys the first generations with
``start_version``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import PlacementError, RepositoryError
from ._app import deployment_app
from ._deploy import DEPLOY_POLL_S, wait_running
from ._haproxy_admin import admin_command
from ._placement import check_left
from ._ray_compat import (
    delete_apps,
    deploy_without_waiting,
    haproxy_admin_socket,
    serve_status,
)
from ._repository import (
    MODEL_CONFIG,
    VERSION_DIR,
    Defaults,
    VersionPlan,
    model_names,
    plan_model,
    scan_model,
    version_numbers,
)
from ._routes import Generation, publish_routes, write_admission

#: Each version's deployment (its application is the generation's: ``Generation.app``).
VERSION_DEPLOYMENT = "QkanPack"
#: Triton's model states (``RepositoryIndex``, ``GET /``).
READY, LOADING, UNLOADING, UNAVAILABLE = "READY", "LOADING", "UNLOADING", "UNAVAILABLE"
#: How long a load waits for a version's replicas.
LOAD_TIMEOUT_S = 900.0
#: How long after a generation is deleted a load waits for its resources to show as
#: released (``ray.available_resources`` lags the deletion) before refusing a placement.
RELEASE_WAIT_S = 5.0
#: A request the router passes on to a version's replicas (every gRPC call, every request
#: with ``--ingress python``) is answered 503 / UNAVAILABLE when they give no answer within
#: twice the version's ``body_timeout_s``, and never sooner than this (``forward_timeout_s``).
FORWARD_MIN_TIMEOUT_S = 10.0
#: The most characters of a client's version text a refusal repeats.
MAX_SHOWN = 40
#: How long one command to HAProxy's admin socket may take.
ADMIN_TIMEOUT_S = 2.0
#: How old the replicas' health (``Repository.watch_health``) may be before a request,
#: the index or a readiness check asks Ray Serve again (in the background), and how often
#: a request passed on to a version checks it while it waits.
HEALTH_TTL_S = 2.0
#: How long the router waits for Ray Serve's controller's status.
HEALTH_TIMEOUT_S = 5.0
#: The most characters of Ray's message about a version's replicas a reason repeats.
MAX_HEALTH_MESSAGE = 300
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refusal:
    """A request the router answers itself: the HTTP status and what to say (the gRPC
    status follows from the HTTP one, ``_router.GRPC_STATUS``)."""

    status: int
    message: str


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
                 *, workdir: str | None = None, log_level: str = "WARNING",
                 watch: bool = False) -> None:
        """``watch``: follow the replicas' health in Ray Serve (``watch_health``; the
        router's, inside Ray Serve: elsewhere there is no Serve to ask)."""
        self.root = Path(root)
        self.watch = watch
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
        self._released = -RELEASE_WAIT_S  # when a generation was last deleted (monotonic)
        for plan, generation in served:
            deployed = Deployed(plan, Generation(plan.model, plan.version, generation))
            self.models.setdefault(plan.model, {})[plan.version] = Version(plan.version,
                                                                          deployed, READY)
            self._admission[deployed.generation.prefix] = admission_of(plan)
            self.loads[plan.model, str(plan.version), "success"] += 1
        self._generation = max((g for _, g in served), default=0)
        #: Serving generations (by application) with no running replica, and Ray's word on
        #: why (``watch_health``): such a version is not ready, though loaded.
        self.down: dict[str, str] = {}
        self._health_at = -HEALTH_TTL_S  # when it was last read (monotonic)
        self._health_task: asyncio.Task[None] | None = None

    # -- what serves ------------------------------------------------------------------

    def ready_versions(self, name: str) -> list[int]:
        """The versions of ``name`` that serve (not those being unloaded, nor those whose
        replicas are all down: ``watch_health``), ascending."""
        return sorted(v for v, s in self.models.get(name, {}).items()
                      if s.state == READY and s.serving is not None
                      and s.serving.generation.app not in self.down)

    def server_ready(self) -> bool:
        """The protocol's server readiness (as Triton's strict readiness): every model loaded
        has a version ready (a model never loaded, or unloaded, is not waited for)."""
        return all(self.ready_versions(name) for name, versions in self.models.items()
                   if any(v.state != UNAVAILABLE or v.reason != "unloaded"
                          for v in versions.values()))

    def state_of(self, version: Version) -> tuple[str, str]:
        """(Triton's state, why) as the index and metrics say it: a loaded version whose
        replicas are all down is UNAVAILABLE, with Ray's reason, until one runs again."""
        serving = version.serving
        if version.state == READY and serving is not None:
            why = self.down.get(serving.generation.app)
            if why is not None:
                return UNAVAILABLE, f"no replica running: {why}"
        return version.state, version.reason

    # -- the replicas' health ----------------------------------------------------------

    def watch_health(self) -> None:
        """Ask Ray Serve again, in the background, when its answer is older than
        ``HEALTH_TTL_S`` (requests, the index and readiness checks call this; none waits
        for it). Without it a version whose replicas all died and cannot start again (a
        file of its artifact changed on disk, a device fault) stayed READY, and each
        request to it waited ``forward_timeout_s`` for a replica that never came."""
        if not self.watch or time.monotonic() - self._health_at < HEALTH_TTL_S:
            return
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.get_running_loop().create_task(self.read_health())

    async def fresh_health(self) -> None:
        """``down`` at most ``HEALTH_TTL_S`` old, waiting for Ray Serve's answer if need be:
        what the index and readiness checks say (not on a request's path)."""
        self.watch_health()
        if self._health_task is not None and not self._health_task.done():
            await asyncio.shield(self._health_task)

    async def read_health(self) -> None:
        """``down`` from Ray Serve's status (each serving generation's running replicas);
        the routes without a version published again when it changed (so that HAProxy
        sends them to the highest version that runs). Kept as it was when the controller
        does not answer."""
        self._health_at = time.monotonic()
        try:
            status = await asyncio.to_thread(serve_status, HEALTH_TIMEOUT_S)
        except Exception as exc:  # Ray's; what was known stands, asked again after the TTL
            logger.warning("model repository: Ray Serve's status not read: %s", exc)
            return
        if status is None or not status.applications:  # no answer, or no Serve to say
            return
        down = {}
        for deployed in self.deployed():
            why = not_running(status, deployed.generation.app)
            if why is not None:
                down[deployed.generation.app] = why
        if down != self.down:
            for app in sorted(down.keys() - self.down.keys()):
                logger.warning("model repository: %s has no replica running: %s", app, down[app])
            self.down = down
            await self.publish_routes()

    def served_models(self) -> list[str]:
        """The models a generation of which serves, by name."""
        return sorted(n for n, versions in self.models.items()
                      if any(v.serving is not None for v in versions.values()))

    def single_model(self) -> str | None:
        """The one model the repository serves, if it serves exactly one (``POST /``)."""
        served = self.served_models()
        return served[0] if len(served) == 1 else None

    def resolve(self, name: str, version: str | None) -> Deployed | Refusal:
        """What serves ``name`` (``version``: a version's number as text; None or "": the
        highest ready one), or why nothing does (404: no such model or version; 503: not
        ready, or no replica of it running)."""
        self.watch_health()
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
                return Refusal(503, f"model {name!r} has no ready version: " + "; ".join(
                    f"{v}: {' '.join(self.state_of(s)).lower()}".strip()
                    for v, s in sorted(versions.items())))
            serving = versions[ready[-1]].serving
            assert serving is not None
            return serving
        # a version is named as its directory is (ASCII digits, no leading zero): "01", "１"
        # or "²" name none, and int() would take the first two and fail on the third
        state = versions.get(int(version)) if VERSION_DIR.match(version) else None
        if state is None:
            shown = version if len(version) <= MAX_SHOWN else version[:MAX_SHOWN] + "..."
            return Refusal(404, f"model {name!r} has no version {shown!r}; it has "
                           f"{', '.join(map(str, sorted(versions)))}")
        if state.serving is None or state.state != READY:  # unloading: its replicas are leaving
            return Refusal(503, f"version {version} of model {name!r} is "
                           f"{state.state.lower()}" + (f": {state.reason}" if state.reason else ""))
        return self._no_replica(state.serving) or state.serving

    def handle(self, deployed: Deployed) -> Any:
        """The deployment handle of ``deployed``'s replicas (made once per generation)."""
        app = deployed.generation.app
        handle = self._handles.get(app)
        if handle is None:
            from ray import serve

            handle = serve.get_deployment_handle(VERSION_DEPLOYMENT, app, _check_exists=False)
            self._handles[app] = handle
        return handle

    async def call(self, deployed: Deployed, method: str, *args: Any) -> Any:
        """``method`` of ``deployed``'s replicas over its handle, or a 503 Refusal when they
        give no answer within ``forward_timeout_s``, or as soon as none of them runs
        (``watch_health``, read again while it waits): a call Ray's handle cannot hand to
        a replica (its generation deleted meanwhile, its replicas dead) otherwise waits
        for ever."""
        response = getattr(self.handle(deployed), method).remote(*args)
        plan = deployed.plan
        timeout_s = forward_timeout_s(plan)
        waiting = asyncio.ensure_future(response)
        deadline = time.monotonic() + timeout_s
        refusal = None
        while refusal is None and (left := deadline - time.monotonic()) > 0:
            done, _ = await asyncio.wait([waiting], timeout=min(left, HEALTH_TTL_S))
            if done:
                return waiting.result()
            self.watch_health()
            refusal = self._no_replica(deployed)
        response.cancel()
        waiting.cancel()
        return refusal or Refusal(503, f"version {plan.version} of model {plan.model!r} gave "
                                  f"no answer within {timeout_s:g} s (it may be unloading); retry")

    def _no_replica(self, deployed: Deployed) -> Refusal | None:
        """The 503 for a generation with no replica running (``down``), else None."""
        why = self.down.get(deployed.generation.app)
        if why is None:
            return None
        plan = deployed.plan
        return Refusal(503, f"version {plan.version} of model {plan.model!r} has no replica "
                       f"running: {why}")

    async def statistics(self, name: str | None) -> list[dict[str, Any]] | Refusal:
        """Triton's ``model_stats`` of every ready version (of model ``name``), each its
        replicas' sum (``_statistics``), ordered by model and version; a version that does
        not answer in time is left out. A name that serves nothing: ``resolve``'s refusal
        (404 unknown or not loaded, 503 nothing ready)."""
        if name is not None and not self.ready_versions(name):
            resolved = self.resolve(name, None)
            assert isinstance(resolved, Refusal)
            return resolved
        targets = [self.models[model][v].serving for model in sorted(self.models)
                   if name in (None, model) for v in self.ready_versions(model)]
        answers = await asyncio.gather(*(self.call(t, "statistics") for t in targets if t))
        return [entry for answer in answers if not isinstance(answer, Refusal)
                for entry in answer]

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
        each version's state (``state_of``; a model never loaded, or unloaded, as one
        UNAVAILABLE entry)."""
        entries = []
        for name in sorted({*self._on_disk(), *self.models}):
            versions = self.models.get(name)
            if not versions:
                entries.append({"name": name, "version": "", "state": UNAVAILABLE,
                                "reason": "unloaded"})
                continue
            for number, version in sorted(versions.items()):
                state, reason = self.state_of(version)
                entries.append({"name": name, "version": str(number), "state": state,
                                "reason": reason})
        return [e for e in entries if e["state"] == READY] if ready_only else entries

    # -- control ----------------------------------------------------------------------

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def load(self, name: str) -> Refusal | None:
        """Load (or reload) model ``name`` from its directory (see the module docstring):
        None when every version serves as its directory says, else the refusal (404: no
        such model; 400: what failed, the versions that could serve serving). Changed
        versions are rolled one at a time (the new generation up, the old one deleted, then
        the next), each first held to what the cluster has left: a reload needs room for
        one version's replicas beside what serves, not for all of them."""
        async with self._lock(name):
            if name not in self._on_disk():  # gone: what of it serves goes too (as a version)
                gone = await self._forget(name)
                return Refusal(404, f"no model {name!r} in the repository {self.root}" + (
                    f": its directory is gone, so its versions {', '.join(map(str, gone))} "
                    "were unloaded" if gone else ""))
            try:
                model = await asyncio.to_thread(scan_model, self.root, name)
            except RepositoryError as exc:  # recorded against each version directory there
                for number in await asyncio.to_thread(version_numbers, self.root / name):
                    self._failed(name, number, "; ".join(exc.problems))
                return Refusal(400, f"cannot load {name!r}: {exc}")
            if (unread := model.unread_config()) is not None:
                logger.warning("model repository: %s", unread)
            plans, problems = await asyncio.to_thread(plan_model, model, self.defaults)
            versions = self.models.setdefault(name, {})
            on_disk = [v.version for v in model.versions]
            for version, problem in problems:  # None: the model's settings, every version
                for number in ([version] if version is not None else on_disk):
                    self._failed(name, number, problem)
            failures = [problem for _, problem in problems]
            for plan in plans:  # rolled one at a time: room for one beside what serves
                failure = await self._deploy(plan)
                if failure is not None:
                    failures.append(failure)
            await self._undeploy(name, [v for v in versions if v not in on_disk], forget=True)
            await self.publish_routes()
        if failures:
            return Refusal(400, f"model {name!r}: " + "; ".join(failures))
        return None

    def _failed(self, name: str, version: int, problem: str) -> None:
        """Record a version (one whose directory is there) that cannot load: counted, and
        unavailable unless a generation of it serves (which keeps serving)."""
        state = self.models.setdefault(name, {}).setdefault(version, Version(version))
        self.loads[name, str(version), "failure"] += 1
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
        problem = await self._placement_problem(plan)
        if problem is not None:
            self._failed(plan.model, plan.version, problem)
            return problem
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

    async def _placement_problem(self, plan: VersionPlan) -> str | None:
        """Why the cluster cannot place ``plan``'s new generation beside what serves (what
        it has left), or None: refused here, Ray would start what fits and wait for the
        rest for ever. Resources of a generation deleted a moment ago may not show as
        released yet: after a deletion, asked again for up to ``RELEASE_WAIT_S``."""
        hint = (f"lower replicas (or cpus_per_replica, gpus_per_replica) in "
                f"{plan.model}/{MODEL_CONFIG}, or unload a model to make room")
        while True:
            try:
                left = await asyncio.to_thread(resources_left)
            except Exception as exc:  # Ray's: its own placement wait stays the bound
                logger.warning("model repository: the cluster's resources unknown: %s", exc)
                return None
            try:
                check_left(plan.label, plan.options, left, hint)
                return None
            except PlacementError as exc:
                if time.monotonic() - self._released > RELEASE_WAIT_S:
                    return str(exc)
            await asyncio.sleep(DEPLOY_POLL_S)

    async def unload(self, name: str) -> Refusal | None:
        """Unload every version of ``name`` (None: done, or nothing was loaded; 404: no such
        model, loaded or in the directory)."""
        async with self._lock(name):
            if name not in self._on_disk():
                return None if await self._forget(name) else Refusal(404, f"unknown model "
                                                                          f"{name!r}")
            await self._undeploy(name, list(self.models.get(name, {})), forget=False)
            await self.publish_routes()
        return None

    async def _forget(self, name: str) -> list[int]:
        """Unload every version of ``name``, whose directory is gone, and forget the model
        (the index lists it no more); the versions it had."""
        versions = sorted(self.models.get(name, {}))
        if versions:
            await self._undeploy(name, versions, forget=True)
            await self.publish_routes()
        self.models.pop(name, None)
        return versions

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
        self._released = time.monotonic()
        for deployed in generations:
            self._handles.pop(deployed.generation.app, None)
            self._admission.pop(deployed.generation.prefix, None)
        self._record_admission()

    def _record_admission(self) -> None:
        if self.workdir is not None:
            write_admission(self.workdir, self._admission)


def not_running(status: Any, app: str) -> str | None:
    """Why application ``app`` of a ``serve.status()`` has no running replica of its
    version's deployment (Ray's message), or None while one runs."""
    application = status.applications.get(app)
    if application is None:
        return "its application is gone from Ray Serve"
    deployment = application.deployments.get(VERSION_DEPLOYMENT)
    if deployment is None:
        return f"its deployment is gone from Ray Serve ({application.status})"
    if any(str(getattr(state, "value", state)) == "RUNNING" and count
           for state, count in deployment.replica_states.items()):
        return None
    message = " ".join((deployment.message or application.message or "").split())
    if len(message) > MAX_HEALTH_MESSAGE:
        message = message[:MAX_HEALTH_MESSAGE] + "..."
    return f"Ray Serve says {deployment.status}" + (f": {message}" if message else "")


def forward_timeout_s(plan: VersionPlan) -> float:
    """How long the router waits for a version's answer to a request it passed on: twice
    its ``body_timeout_s`` (a request's whole time at the ingress is bounded by the same
    setting), at least ``FORWARD_MIN_TIMEOUT_S``."""
    return max(FORWARD_MIN_TIMEOUT_S, 2 * plan.options.limits.body_timeout_s)


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


def resources_left() -> dict[str, float]:
    """What the cluster has left, beside what its replicas hold (``ray.available_resources``)."""
    import ray

    return dict(ray.available_resources())
