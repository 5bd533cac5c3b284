"""Deploying on Ray Serve and watching it until it serves: the one loop ``serve`` (one
artifact or a repository's versions) and a repository's router (a version loaded while
serving) wait in. Deployed without waiting (``_ray_compat.deploy_without_waiting``:
``serve.run`` would wait forever for replicas the cluster cannot place), then watched from
the caller's thread, which no Ray call outlives."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ..errors import ServeError
from ._ray_compat import serve_status

#: A replica Ray cannot place for this long fails the start (the cluster lacks resources).
PLACEMENT_TIMEOUT_S = 20.0
#: How Ray Serve's deployment status begins a replica's failed start (its error follows).
REPLICA_START_FAILED = "A replica failed to start"
DEPLOY_POLL_S = 0.25  # how often a deploy wait asks Serve for the apps' status
#: How long one poll waits for Serve's controller: a stop is seen within about this.
STATUS_TIMEOUT_S = 2.0


def app_state(name: str, unplaced_since: float | None) -> tuple[bool, float | None]:
    """(whether application ``name`` runs, since when a replica waits to be placed); raises
    ServeError for a deployment that failed, a replica that failed to start (its error, which
    names its node: on a cluster, the replicas of one node can fail where the others serve,
    and Ray then retries them for ever) or replicas unplaced for ``PLACEMENT_TIMEOUT_S``."""
    serving = serve_status(STATUS_TIMEOUT_S)
    if serving is None:  # the controller did not answer in time: ask again next poll
        return False, unplaced_since
    app = serving.applications.get(name)
    if app is None:
        return False, unplaced_since
    status = str(app.status.value)
    if status == "RUNNING":
        return True, None
    messages = [d.message for d in app.deployments.values() if d.message]
    if status == "DEPLOY_FAILED":
        raise ServeError("no replica could load the artifact: "
                         + last_line("\n".join(messages) or app.message))
    failed = [m for m in messages if REPLICA_START_FAILED in m]
    if failed:  # Ray would retry it for ever once another replica runs (a node that cannot load)
        raise ServeError("a replica failed to start: " + last_line(failed[0], limit=1500))
    if not any("to be scheduled" in m for m in messages):
        return False, None
    now = time.monotonic()
    if unplaced_since is not None and now - unplaced_since > PLACEMENT_TIMEOUT_S:
        raise ServeError("the cluster cannot place the replicas: " + " ".join(messages)[:600])
    return False, unplaced_since or now


def wait_running(names: Sequence[str], timeout_s: float,
                 stopping: Callable[[], bool] = lambda: False,
                 label: Callable[[str], str] = lambda name: name) -> bool:
    """Wait until every application of ``names`` runs (True), or ``stopping()`` turns true
    (False); ServeError, prefixed with ``label(name)``, for the first that cannot. Each poll
    waits at most ``STATUS_TIMEOUT_S`` for Serve's controller, so a stop ends the wait
    within seconds even while the controller does not answer."""
    started = time.monotonic()
    unplaced: dict[str, float | None] = dict.fromkeys(names)
    while unplaced:
        if stopping():
            return False
        for name in list(unplaced):
            if stopping():
                return False
            try:
                running, unplaced[name] = app_state(name, unplaced[name])
            except ServeError as exc:
                raise ServeError(f"{label(name)}: {exc.problem}", hint=exc.hint) from None
            if running:
                del unplaced[name]
        if unplaced and time.monotonic() - started > timeout_s:
            raise ServeError(f"{', '.join(map(label, unplaced))}: replicas not ready after "
                             f"{timeout_s:g} s")
        if unplaced:
            time.sleep(DEPLOY_POLL_S)
    return True


def last_line(error: BaseException | str, limit: int = 500) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1][:limit] if lines else type(error).__name__
