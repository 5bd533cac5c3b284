"""``qkan-pack serve --address`` on a multi-node Ray cluster (issue 35, item 5): two
``ray start`` nodes on this host, each on a loopback address of its own (head 127.0.0.3,
worker 127.0.0.2) with one CPU, so that two replicas of one CPU must spread over both, and
each started in a directory of its own (a relative artifact path is the command's, not the
nodes'). The cluster runs with Ray's token authentication, like every Ray serve starts.

Checked: replicas on both nodes (each names its node), answers equal to the ``Predictor``'s
from both, a second serve refused while Serve runs there, no request lost beyond HAProxy's
documented replies when the worker node (its raylet and every process under it) is killed
under load, Serve gone from the cluster once the command stops; a node that cannot load the
artifact (the model's package missing there) fails the start naming that node, and a
loopback ``--host`` with replicas on another node is refused before anything deploys.

Every process of the cluster carries ``TAG_ENV`` (the raylets and the control store) or
descends from one, or has a file open under the cluster's directory (Ray's agents rewrite
their environment for their process title): all are killed at the end, whatever happened.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ._server import (
    TAG_ENV,
    Server,
    command_line,
    free_port,
    listeners,
    strict_json,
    tagged_pids,
)

pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'qkan-pack[serve]')")
pytestmark = [pytest.mark.serve, pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="loopback addresses beyond 127.0.0.1, /proc")]

HEAD_IP, WORKER_IP = "127.0.0.3", "127.0.0.2"
NODE_ENV = "QKAN_PACK_TEST_RAY_NODE"  # which node of the cluster a process was started for
TOKEN = "cluster-token-0123456789abcdef"
ROW = {"inputs": [[0.1, 0.2]]}


def _ppids() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return parents


def _environ_has(pid: int, *markers: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return all(marker.encode() in environ for marker in markers)


def _opens_under(pid: int, root: str) -> bool:
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd).startswith(root):
                    return True
    return False


def _with_descendants(roots: set[int]) -> set[int]:
    parents = _ppids()
    found = set(roots)
    while True:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        if not more:
            return found
        found |= more


def _kill_all(find: Any, timeout_s: float = 20.0) -> None:
    """SIGKILL whatever ``find()`` returns until it returns nothing."""
    deadline = time.monotonic() + timeout_s
    while (pids := find() - {os.getpid()}) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    assert not find() - {os.getpid()}, "cluster processes left"


@dataclass
class LocalCluster:
    """Ray nodes started with ``ray start`` as a user starts them, on this host."""

    root: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        self.env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
                    "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
                    TAG_ENV: self.tag}

    @property
    def address(self) -> str:
        return f"{HEAD_IP}:{self.port}"

    def start_head(self) -> None:
        self._ray_start("head", "--head", "--node-ip-address", HEAD_IP, "--port", str(self.port),
                        "--temp-dir", str(self.root / "ray"), "--include-dashboard", "false",
                        "--ray-client-server-port", str(free_port()),
                        "--dashboard-port", str(free_port()),
                        "--resources", json.dumps({"qkan_test_head": 1}))

    def add_worker(self, name: str, env: dict[str, str] | None = None) -> None:
        self._ray_start(name, "--address", self.address, "--node-ip-address", WORKER_IP,
                        "--resources", json.dumps({f"qkan_test_{name}": 1}), env=env)

    def _ray_start(self, node: str, *args: str, env: dict[str, str] | None = None) -> None:
        ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
        done = subprocess.run(
            [ray, "start", *args, "--num-cpus", "1", "--object-store-memory", str(100 * 2**20),
             "--dashboard-agent-listen-port", str(free_port()), "--disable-usage-stats"],
            env={**self.env, NODE_ENV: node, **(env or {})}, cwd=self.root,
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr

    def node_pids(self, node: str) -> set[int]:
        """A node's raylet (and any process ``ray start`` left for it) and all below it."""
        roots = {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                 and _environ_has(int(p.name), f"{TAG_ENV}={self.tag}", f"{NODE_ENV}={node}")}
        return _with_descendants(roots)

    def pids(self) -> set[int]:
        root = str(self.root)
        tagged = {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                  and (_environ_has(int(p.name), f"{TAG_ENV}={self.tag}")
                       or _opens_under(int(p.name), root))}
        return _with_descendants(tagged)

    def kill_node(self, node: str) -> None:
        """The node's host lost: SIGKILL to its raylet and every process under it at once."""
        _kill_all(lambda: self.node_pids(node))

    def stop(self) -> None:
        _kill_all(self.pids)

    def running(self, name: str) -> list[int]:
        """Cluster processes whose command line names ``name`` (Serve's actors, HAProxy)."""
        return sorted(pid for pid in self.pids() if name in command_line(pid))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix="qkc-", dir="/tmp"))  # Ray's socket paths are short
    running = LocalCluster(root)
    try:
        running.start_head()
        yield running
    finally:
        running.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def _serve_args(cluster: LocalCluster, token_file: Path, *more: str) -> list[str]:
    return ["--address", cluster.address, "--replicas", "2", "--host", "0.0.0.0",
            "--auth-token-file", str(token_file), "--grace-s", "2", *more]


def _serve_env(cluster: LocalCluster) -> dict[str, str]:
    return {key: cluster.env[key] for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}


def _run_serve(artifact: Path, args: list[str], cluster: LocalCluster, timeout: float
               ) -> tuple[subprocess.CompletedProcess, float]:
    """A serve run to its end (the artifact by its name, from its directory)."""
    tag = uuid.uuid4().hex
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "qkan_pack", "serve", artifact.name, *args],
                              capture_output=True, text=True, timeout=timeout,
                              cwd=artifact.parent,
                              env={**os.environ, **_serve_env(cluster), TAG_ENV: tag})
    finally:
        _kill_all(lambda: set(tagged_pids(tag)))  # the server the command runs, on a timeout
    return done, time.monotonic() - started


def _until(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return value


def test_replicas_spread_over_both_nodes_and_a_node_lost_under_load_loses_no_request(
        cluster: LocalCluster, artifact: Path, token_file: Path) -> None:
    cluster.add_worker("worker")
    # a relative path, from a directory the nodes were not started in: before, replicas
    # looked for it in their own working directory and no node could load it
    server = Server(Path(artifact.name), _serve_args(cluster, token_file),
                    env=_serve_env(cluster), token=TOKEN, cwd=artifact.parent)
    try:
        server.start(timeout_s=240)
        assert "on cpu; bearer token required" in server.stdout[0]
        # the serve's ingress settings reach a cluster started without them: HAProxy (through
        # the wrapper) on the head node listens on the port, not one Python proxy per node
        ingress = [pid for pid, _, port in listeners(sorted(cluster.pids())) if port == server.port]
        assert ingress and all("haproxy" in command_line(pid) for pid in ingress), ingress
        assert server.request("/-/routes", token=None)[0] == 401  # the token gate came too
        assert server.request("/-/healthz", token=None)[::2] == (200, b"")
        nodes = _replicas_on_both_nodes(server)
        _answers_equal_the_predictors_from_both_nodes(server, artifact, nodes)
        _a_second_serve_is_refused(artifact, cluster, token_file)
        _a_node_lost_under_load_loses_no_request(server, cluster)
        code, stderr = server.stop(signal.SIGTERM)
        assert code == 0 and "stopped" in stderr, stderr
        # Serve stopped with the command: before, its controller and ingress stayed on the
        # cluster, holding the port, after the command had said "stopped"
        for name in ("ServeController", "HAProxyManager", "haproxy", "ServeReplica"):
            _until(lambda name=name: not cluster.running(name), 30, f"{name} left on the cluster")
    finally:
        server.kill()


def _replicas_on_both_nodes(server: Server) -> dict[str, str]:
    """Node id by node address, from the replicas' own descriptions (``GET /``) and stats."""
    seen: dict[str, str] = {}
    deadline = time.monotonic() + 30  # HAProxy takes a new replica in once its checks pass
    while len(seen) < 2 and time.monotonic() < deadline:
        status, described = server.json("/")
        assert status == 200, described
        replica = described["replica"]
        seen[replica["node_ip"]] = replica["node_id"]
        time.sleep(0.05)
    assert set(seen) == {HEAD_IP, WORKER_IP}, seen
    assert len(set(seen.values())) == 2 and all(len(n) == 56 for n in seen.values()), seen
    status, stats = server.json("/stats")
    assert status == 200 and seen[stats["node_ip"]] == stats["node_id"]
    return seen


def _answers_equal_the_predictors_from_both_nodes(server: Server, artifact: Path,
                                                  nodes: dict[str, str]) -> None:
    from qkan_pack import Predictor

    rows = np.random.default_rng(7).uniform(-1, 1, (8, 2)).astype(np.float32)
    with Predictor.load(artifact, "cpu") as loaded:
        whole = np.asarray(loaded(rows))
        single = [np.asarray(loaded(row[None])) for row in rows]
    for _ in range(3):  # consecutive requests alternate between the idle replicas
        status, got = server.json("/", {"inputs": rows.tolist()})
        assert status == 200, got
        np.testing.assert_allclose(np.asarray(got["outputs"], np.float32), whole,
                                   rtol=1e-5, atol=1e-6)
        for row, want in zip(rows, single):
            status, got = server.json("/", {"inputs": [row.tolist()]})
            assert status == 200, got
            np.testing.assert_allclose(np.asarray(got["outputs"], np.float32), want,
                                       rtol=1e-5, atol=1e-6)
    answered: dict[str, int] = {}
    for _ in range(40):
        _, stats = server.json("/stats")
        answered[stats["node_ip"]] = stats["requests"]["rows"] + stats["requests"]["direct"]
        if len(answered) == 2:
            break
    assert set(answered) == set(nodes) and all(answered.values()), answered


def _a_second_serve_is_refused(artifact: Path, cluster: LocalCluster, token_file: Path) -> None:
    """Its app, named like the first, would have replaced the first serve's."""
    done, _ = _run_serve(artifact, _serve_args(cluster, token_file, "--port", str(free_port())),
                         cluster, timeout=120)
    assert done.returncode == 1 and "Ray Serve already runs on this cluster" in done.stderr, \
        done.stderr


@dataclass
class _Outcome:
    at: float
    status: int | None
    retry_after: str | None = None
    error: str | None = None


def _client(port: int, stop: threading.Event, outcomes: list[_Outcome]) -> None:
    """One keep-alive client posting single rows until ``stop``; a connection that fails is
    replaced (the failure is recorded)."""
    body = json.dumps(ROW).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while not stop.is_set():
        try:
            conn.request("POST", "/", body, headers)
            reply = conn.getresponse()
            raw = reply.read()
            outcome = _Outcome(time.monotonic(), reply.status, reply.getheader("Retry-After"))
            if reply.status == 200 and "outputs" not in strict_json(raw):
                outcome.error = raw.decode(errors="replace")[:200]
        except (OSError, http.client.HTTPException) as exc:
            outcome = _Outcome(time.monotonic(), None, error=f"{type(exc).__name__}: {exc}")
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        outcomes.append(outcome)
    conn.close()


def _a_node_lost_under_load_loses_no_request(server: Server, cluster: LocalCluster,
                                              clients: int = 8) -> None:
    """The worker node killed while 8 keep-alive clients post rows: HAProxy retries the
    requests its replica held on the head node's (docs/security.md, "Faults"); the only
    other documented answer is the JSON 503 with Retry-After. Anything else is a lost
    request."""
    stop = threading.Event()
    outcomes: list[_Outcome] = []
    threads = [threading.Thread(target=_client, args=(server.port, stop, outcomes))
               for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2.0)
        assert cluster.node_pids("worker")
        killed_at = time.monotonic()
        cluster.kill_node("worker")
        time.sleep(4.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    kinds = Counter("200" if o.status == 200 and o.error is None
                    else "503+Retry-After" if o.status == 503 and o.retry_after
                    else "lost" for o in outcomes)
    lost = [o for o in outcomes if not (o.status == 200 and o.error is None)
            and not (o.status == 503 and o.retry_after)]
    assert not lost, (kinds, lost[:5])
    after = [o for o in outcomes if o.at > killed_at + 1.0]
    assert sum(o.status == 200 for o in after) >= 20, kinds  # the head's replica serves on
    assert {server.json("/")[1]["replica"]["node_ip"] for _ in range(6)} == {HEAD_IP}


@pytest.fixture(scope="module")
def node_without_qkan(cluster: LocalCluster) -> Iterator[str]:
    """A worker node on which the model's package is missing (a ``qkan`` that is not there
    shadows the installed one): a node built from another image, a host set up by hand."""
    shadow = cluster.root / "without-qkan" / "qkan"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'qkan\'", name="qkan")\n')
    path = os.pathsep.join(p for p in (str(shadow.parent), os.environ.get("PYTHONPATH")) if p)
    cluster.add_worker("without-qkan", env={"PYTHONPATH": path})
    yield "without-qkan"
    cluster.kill_node("without-qkan")


def test_a_loopback_host_with_replicas_on_another_node_is_refused_before_deploying(
        cluster: LocalCluster, node_without_qkan: str, artifact: Path, token_file: Path) -> None:
    """HAProxy on the head reaches a replica at its node's address, and the replica listens
    on ``--host``: with 127.0.0.1, the other node's replicas could not be reached."""
    args = [a for a in _serve_args(cluster, token_file) if a not in ("--host", "0.0.0.0")]
    done, took = _run_serve(artifact, [*args, "--port", str(free_port())], cluster, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (f"--host 127.0.0.1: the replicas on the cluster's other nodes ({WORKER_IP} (id "
            in done.stderr), done.stderr
    assert "--host 0.0.0.0" in done.stderr and took < 60
    assert not cluster.running("ServeController")


def test_a_node_that_cannot_load_the_artifact_fails_the_start_naming_it(
        cluster: LocalCluster, node_without_qkan: str, artifact: Path, token_file: Path) -> None:
    """Before, the head node's replica served and Ray retried the other node's for ever:
    the command waited its 900 s deploy timeout without a word. Now the first failed start
    ends it, naming the node, the artifact and the reason."""
    done, took = _run_serve(artifact, [*_serve_args(cluster, token_file), "--port",
                                       str(free_port())], cluster, timeout=240)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""  # no ready line, and no Ray line about Serve's own shutdown
    assert (f"a replica failed to start: qkan_pack.errors.ReplicaLoadError: the replica on node "
            f"{WORKER_IP} (id " in done.stderr), done.stderr
    assert f"cannot load the artifact at {artifact}: ModelSourceError" in done.stderr
    assert "No module named 'qkan'" in done.stderr and took < 180
    _until(lambda: not cluster.running("ServeController"), 30, "Serve left on the cluster")


def test_a_serve_without_address_starts_its_own_ray_whatever_ray_start_left(
        cluster: LocalCluster, artifact: Path) -> None:
    """Regression: without ``--address`` the serve called ``ray.init()`` without one, and Ray
    then joins the cluster named in its address file, which ``ray start`` writes: the serve
    ran on that cluster, without its settings, its replica on the cluster's node. It starts
    its own Ray now, whatever the file says."""
    elsewhere = Path(tempfile.mkdtemp(prefix="qkl-", dir="/tmp"))
    (elsewhere / "ray").mkdir()
    (elsewhere / "ray" / "ray_current_cluster").write_text(cluster.address)  # as `ray start`
    server = Server(artifact, [], env={**_serve_env(cluster), "RAY_TMPDIR": str(elsewhere)})
    try:
        server.start(timeout_s=240)
        assert server.json("/")[1]["replica"]["node_ip"] == "127.0.0.1"  # its loopback node
        assert not cluster.running("ServeReplica")
        code, stderr = server.stop(signal.SIGTERM)
        assert code == 0, stderr
    finally:
        server.kill()
        shutil.rmtree(elsewhere, ignore_errors=True)


def test_a_joined_cluster_is_checked_before_anything_deploys(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """The refusals ``check_joinable`` makes, on a described cluster: Serve running there, the
    command on a node other than the head (where the ingress and its files are), and a host
    the head's HAProxy cannot reach other nodes' replicas at."""
    import ray

    from qkan_pack.errors import ServeError
    from qkan_pack.serve import _cluster, _ray_compat
    from qkan_pack.serve._cluster import Node, check_joinable

    head, other = Node("a" * 56, "10.0.0.1", head=True), Node("b" * 56, "10.0.0.2")
    here = {"node": head.node_id}

    class Context:
        def get_node_id(self) -> str:
            return here["node"]

    monkeypatch.setattr(ray, "get_runtime_context", Context)
    monkeypatch.setattr(_cluster, "alive_nodes", lambda: [head, other])
    monkeypatch.setattr(_ray_compat, "serve_running", lambda: True)
    with pytest.raises(ServeError, match="Ray Serve already runs on this cluster"):
        check_joinable("0.0.0.0", haproxy=True)
    monkeypatch.setattr(_ray_compat, "serve_running", lambda: False)
    check_joinable("0.0.0.0", haproxy=True)
    check_joinable("::", haproxy=True)
    check_joinable("127.0.0.1", haproxy=False)  # Ray's proxy reaches replicas through Ray
    with pytest.raises(ServeError, match=r"--host 127\.0\.0\.1: the replicas on the cluster's "
                       r"other nodes \(10\.0\.0\.2 \(id bbbbbbbbbbbb\)\)"):
        check_joinable("127.0.0.1", haproxy=True)
    here["node"] = other.node_id
    with pytest.raises(ServeError, match=r"runs on node 10\.0\.0\.2 \(id bbbbbbbbbbbb\), not on "
                       r"the head node 10\.0\.0\.1 \(id aaaaaaaaaaaa\)"):
        check_joinable("0.0.0.0", haproxy=True)
