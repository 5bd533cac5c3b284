"""Every access to Ray's internals, in one place, checked against the releases it was
written for.

``qkan-pack serve`` reaches past Ray Serve's public API where the public API cannot do the
job: deploying without blocking (``serve._run(_blocking=False)``: ``serve.run`` waits forever
for replicas a cluster cannot place), re-reading Ray's cached config (``ray._raylet.Config``),
keeping a local node's exporters on loopback (``ray._private.ray_constants``), deleting several
applications at once (the Serve client's ``delete_apps``), Serve's status within a bound
(the client's controller: ``serve_status``), a default application for gRPC
calls that name none (``gRPCProxyRequest.setup_variables``, a model repository's), turning off
auto-init after shutdown (``ray._private.auto_init_hook``), finding a running Serve by its
controller's actor name and the head node by its resource (``serve_running``,
``HEAD_NODE_RESOURCE``), where Ray puts a node's HAProxy admin socket
(``haproxy_admin_socket``, for the ingress counts ``/metrics`` exports). The HAProxy ingress
also depends
on the config Ray Serve generates (``_haproxy`` rewrites it). ``check_ray`` runs before Ray
starts and refuses a release outside ``SUPPORTED`` with the range and the fix; a test pins
each private name.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from .._supported import RAY
from ..errors import ServeError

#: Ray releases whose internals (and generated HAProxy config) this module was read from
#: (stated in ``_supported``; the ``serve`` extra declares the same range).
SUPPORTED = RAY
#: The extra's requirement, for the message.
INSTALL = f"pip install 'ray[serve]{SUPPORTED.pip_specifier}'"
#: The resource only the head node has (``ray._common.constants.HEAD_NODE_RESOURCE_NAME``).
HEAD_NODE_RESOURCE = "node:__internal_head__"


def check_ray() -> None:
    """Refuse a Ray outside ``SUPPORTED`` before any of it runs (``ServeError``)."""
    import ray

    version = ray.__version__
    if not SUPPORTED.admits(version):
        raise ServeError(SUPPORTED.outside(version, "qkan-pack serve relies on internals of "
                                                    "that release line"), hint=INSTALL)


#: Ray Serve builds its config objects (a deploy's, and those a status read parses) with a
#: module registered for pickling by value, unregistering it after: two threads doing so at
#: once fail ("... is not registered for pickle by value"), as a model repository's load
#: did while its router read the replicas' health. One at a time in this process.
_SERVE_CONFIGS = threading.Lock()


def deploy_without_waiting(app: Any, name: str, logging_config: Mapping[str, Any],
                           route_prefix: str = "/") -> Any:
    """Deploy ``app`` as application ``name`` at ``route_prefix`` and return its handle
    without waiting for replicas (other applications are left as they are)."""
    from ray import serve

    with _SERVE_CONFIGS:
        return serve._run(app, _blocking=False, name=name, route_prefix=route_prefix,
                          logging_config=dict(logging_config))


def delete_apps(names: Sequence[str], blocking: bool = True) -> None:
    """Delete applications ``names`` together (each drains its requests; ``serve.delete``
    takes one at a time, and waits for each in turn)."""
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    if client is not None:  # None: Serve is not running, so neither is any application
        client.delete_apps(list(names), blocking=blocking)


def serve_status(timeout_s: float) -> Any | None:
    """``serve.status()``, waiting at most ``timeout_s`` for Serve's controller (None: no
    answer in time). ``serve.status`` waits on the controller for ever, and a controller
    that is restarting, or busy with more replicas than it can hold, can take minutes: a
    deploy wait polling it would not see the stop signal meanwhile."""
    import ray
    from ray.exceptions import GetTimeoutError
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeInstanceDetails, ServeStatus

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:  # Serve has not started
        return ServeStatus()
    asked = client._controller.get_serve_instance_details.remote()
    try:
        details = ray.get(asked, timeout=timeout_s)
    except GetTimeoutError:
        return None
    with _SERVE_CONFIGS:
        return ServeInstanceDetails(**details)._get_status()


#: Where a model repository names the application that gRPC calls without ``application``
#: metadata go to (``route_grpc_calls``), in the environment of Ray's processes.
GRPC_APPLICATION_ENV = "QKAN_PACK_GRPC_APPLICATION"


def route_grpc_calls() -> None:
    """Send gRPC calls that name no application to the one ``GRPC_APPLICATION_ENV`` names
    (a model repository's router), in Ray Serve's Python gRPC proxy of this process.

    Ray Serve routes a gRPC call by its ``application`` metadata, or, without it, to the
    one application there is; a repository serves several (one per model version), and
    tritonclient's calls carry no such metadata, so each would be refused NOT_FOUND
    ("Application metadata not set"). Ray offers no setting for a default; its
    ``gRPCProxyRequest.setup_variables`` reads the metadata, and is wrapped here to fill
    the application in where the call named none. Runs where the servicer function runs
    (each proxy); without the variable, nothing changes. (HAProxy's gRPC frontend is told
    the same by the config rewrite, ``_haproxy``.)"""
    target = os.environ.get(GRPC_APPLICATION_ENV)
    if not target:
        return
    from ray.serve._private.proxy_request_response import gRPCProxyRequest

    original = gRPCProxyRequest.setup_variables
    if getattr(original, "qkan_pack_default", None) == target:
        return

    def setup_variables(self: Any) -> None:
        original(self)
        if not self.app_name and not self.is_route_request and not self.is_health_request:
            self.app_name = target

    setup_variables.qkan_pack_default = target  # type: ignore[attr-defined]
    gRPCProxyRequest.setup_variables = setup_variables  # type: ignore[method-assign]


def serve_running() -> bool:
    """Whether Ray Serve's controller runs on the cluster Ray is connected to (asked by its
    actor name: ``serve.status`` would start Serve where it does not run)."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return False
    return True


def refresh_ray_config() -> None:
    """Have Ray's core read the environment again. It caches its config (``RAY_AUTH_MODE``
    among it, set by ``ingress_env``) when ray is first imported: a caller that imported ray
    before ``serve_forever`` leaves it 'disabled', and the driver then cannot authenticate to
    the control store it has just started with tokens (``AuthenticationError`` after a minute
    of retries). Ray refreshes the same cache itself when it turns token auth on
    (``ray._private.authentication``)."""
    with suppress(ImportError, AttributeError):
        from ray._raylet import Config  # type: ignore[attr-defined]  # compiled; its stub omits it

        Config.initialize("")


@contextmanager
def loopback_ray_node(local: bool) -> Iterator[None]:
    """Start a local Ray as a loopback node (``127.0.0.1``). Its processes bind their
    unauthenticated Prometheus exporters (the dashboard agent's, the dashboard's on 44227,
    the autoscaler's on 44217) to every interface unless the node's address is loopback,
    whatever ``--host`` says; as a loopback node they, its dashboard agent and its gRPC ports
    listen on 127.0.0.1 only. ``ray.init(_node_ip_address="127.0.0.1")`` cannot do it: Ray
    replaces a loopback address with the host's outward one unless its
    ``ENABLE_RAY_CLUSTER`` is off (set by ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before ray
    is imported, or here, on the imported constant, for the ``ray.init`` only). Serve's own
    listeners still bind ``--host``. A cluster joined with ``--address`` is left as it is."""
    if not local:
        yield
        return
    import ray
    from ray._private import ray_constants

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        raise ServeError(f"Ray {ray.__version__} has no ray_constants.ENABLE_RAY_CLUSTER: its "
                         "metrics exporters could not be kept on loopback",
                         hint="use Ray 2.60 (pip install 'ray[serve]==2.60.*')")
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def without_auto_init() -> None:
    """Turn off Ray's auto-init in this process (Ray reads ``RAY_ENABLE_AUTO_CONNECT`` once,
    at import, so the flag is set on its module): a Ray call after ``ray.shutdown`` must fail,
    not start a new local Ray from whatever thread made it ("SIGTERM handler is not set
    because current thread is not the main thread"). The deploy wait polls from the caller's
    thread (``_run_with_deadline``) and makes no such call; this guards any other late call
    (a caller's own handle, Ray's callbacks)."""
    with suppress(ImportError, AttributeError):
        from ray._private import auto_init_hook

        auto_init_hook.enable_auto_connect = False




def haproxy_admin_socket() -> str | None:
    """The admin socket of the HAProxy Ray runs on this node (whether or not it runs): Ray
    2.60 puts it at ``RAY_SERVE_HAPROXY_SOCKET_PATH`` with the node's id as a directory
    before the file name (``HAProxyManager``'s ``_per_node``). None outside a Ray worker."""
    import ray
    from ray.serve._private.constants import RAY_SERVE_HAPROXY_SOCKET_PATH

    if not ray.is_initialized():
        return None
    directory, name = os.path.split(RAY_SERVE_HAPROXY_SOCKET_PATH)
    return os.path.join(directory, ray.get_runtime_context().get_node_id(), name)
