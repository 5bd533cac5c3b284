"""Serving on a Ray cluster: where each replica runs, and what joining a cluster started
elsewhere (``serve --address``: ``ray start`` on each host, KubeRay) takes.

A replica names its Ray node (``this_node``) in ``GET /``, ``GET /stats`` and in the error of
a load that fails there (``ReplicaLoadError``): on a cluster one node can lack the artifact,
hold another copy of it, or lack a package its model imports, while the others load.

A local Ray inherits the serve's environment (``_launch.ingress_env``: HAProxy through the
wrapper, the token gate, side ports, Serve's timings). A cluster's processes were started
with their own, so Serve's processes there (its controller, which starts the proxies and the
replicas) get the same variables as the job's runtime environment (``job_runtime_env``);
Ray's auth mode is the cluster's own and is left out.

The HTTP ingress runs on the head node only (``PROXY_LOCATION``): HAProxy runs through a
wrapper whose files live in this command's work directory, which only the host running the
command has, so the command must run on the head node, and one ingress per node would all
bind the same port on a host running several nodes. HAProxy reaches replicas on other nodes
at their node's address, where each replica listens on ``--host``: with other nodes,
``--host`` must be a wildcard (``check_joinable``). Serve is started by the command and shut
down with it; a cluster where Serve already runs (another serve's, a RayService's) is
refused: its settings are not this command's, and this command's app would replace an app
of the same name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ArtifactError, ReplicaLoadError, ServeError

#: Where Serve runs its HTTP ingress on a joined cluster (see above).
PROXY_LOCATION = "HeadOnly"
#: Addresses a replica on another node can be reached at when it binds them.
WILDCARDS = ("0.0.0.0", "::")
#: The serve's variables that belong to each node, not to the job: Ray's auth mode is the
#: cluster's (a node started without tokens cannot be made to use them).
NODE_OWN = frozenset({"RAY_AUTH_MODE"})


@dataclass(frozen=True)
class Node:
    """A Ray node: its id (Ray's hex) and the address other nodes reach it at."""

    node_id: str
    node_ip: str
    head: bool = False

    def __str__(self) -> str:
        return f"{self.node_ip} (id {self.node_id[:12]})"


def this_node() -> dict[str, str | None]:
    """The Ray node this process runs on, as ``GET /`` shows it (``node_id``, ``node_ip``);
    None for both outside Ray (a replica built in this process, Ray's local testing mode)."""
    try:
        import ray

        if not ray.is_initialized():
            return {"node_id": None, "node_ip": None}
        return {"node_id": ray.get_runtime_context().get_node_id(),
                "node_ip": ray.util.get_node_ip_address()}
    except Exception:
        return {"node_id": None, "node_ip": None}


def load_failed(error: BaseException, path: str, node: Mapping[str, str | None]
                ) -> ReplicaLoadError:
    """The error a replica raises when ``Predictor.load`` failed on its node (the load's own
    error stays its ``__cause__``; its message already says how to fix a model's failure)."""
    hint = (f"every node needs the artifact at {path}, with the digest serve verified "
            "(a shared filesystem, or a copy checked with qkan-pack verify --expected-digest)"
            if isinstance(error, ArtifactError) else "")
    return ReplicaLoadError(node_ip=node.get("node_ip"), node_id=node.get("node_id"),
                            path=path, reason=f"{type(error).__name__}: {error}", hint=hint)


def job_runtime_env(env: Mapping[str, str]) -> dict[str, Any]:
    """``ray.init``'s runtime environment for a joined cluster: the serve's variables for
    every process the job starts (Serve's controller, and through it the proxies, HAProxy
    and the replicas), all but ``NODE_OWN``."""
    return {"env_vars": {key: value for key, value in env.items() if key not in NODE_OWN}}


def alive_nodes() -> list[Node]:
    """The cluster's alive nodes (Ray must be initialised)."""
    import ray

    from ._ray_compat import HEAD_NODE_RESOURCE

    return [Node(n["NodeID"], n["NodeManagerAddress"], HEAD_NODE_RESOURCE in n["Resources"])
            for n in ray.nodes() if n["Alive"]]


def check_joinable(host: str, haproxy: bool) -> None:
    """Refuse a joined cluster this serve cannot serve on (``ServeError`` saying how to fix
    it): Serve already running there, this command not on the head node, or, with HAProxy,
    other nodes whose replicas would listen on a ``host`` the head's HAProxy cannot reach."""
    import ray

    from ._ray_compat import serve_running

    if serve_running():
        raise ServeError("Ray Serve already runs on this cluster (another serve, a RayService "
                         "or serve.start): its ingress and settings are not this command's, "
                         "and its app named qkan-pack would be replaced",
                         hint="stop it (`serve shutdown` on the head node) or join another cluster")
    nodes = alive_nodes()
    here = ray.get_runtime_context().get_node_id()
    head = next((n for n in nodes if n.head), None)
    if head is not None and head.node_id != here:
        this = next((str(n) for n in nodes if n.node_id == here), here[:12])
        raise ServeError(f"serve --address runs on node {this}, not on the head node {head}: "
                         "Serve's HTTP ingress runs on the head node, with this command's "
                         "HAProxy files", hint="run qkan-pack serve on the head node")
    others = [n for n in nodes if n.node_id != here]
    if haproxy and others and host not in WILDCARDS:
        raise ServeError(f"--host {host}: the replicas on the cluster's other nodes "
                         f"({', '.join(map(str, others))}) would listen there, out of reach of "
                         "HAProxy on this node",
                         hint="serve with --host 0.0.0.0 (or ::) and a token "
                         "(--auth-token-file)")
