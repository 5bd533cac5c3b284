"""``qkan-pack serve REPO`` (issue 43, items 1 and 4): NVIDIA's tritonclient over HTTP and gRPC
against a repository of two models, one of them in two versions, behind a token: the index,
every version answering as its ``Predictor``, the highest version by default, 404 and
NOT_FOUND for unknown names and versions, a model's config file applied, metrics labelled by
model and version, load and unload without interrupting the other models, a version that
fails (its manifest, its load) never replacing the one serving. Then the same routes through
Ray's Python proxy, where the router passes every request on over a handle."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qkan_pack import Predictor

from ..conftest import EXAMPLES, MODELS
from ._server import Server, grpc_server

pytestmark = [pytest.mark.serve, pytest.mark.slow]

TOKEN = "repository-token-0123456789abcdef"
VERSIONS = (("mlp", 1), ("mlp", 2), ("clf", 1))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The artifacts: ``mlp`` 1 and 2 (tests/models/plain_mlp.py, two widths), ``clf`` 1
    (examples/plain_mlp.py, four features in), and an ``mlp`` 3 whose replicas fail their
    load (tests/models/fails_in_serve.py, with the server's QKAN_PACK_TEST_FAIL_LOAD)."""
    from qkan_pack import build

    out = tmp_path_factory.mktemp("artifacts")
    made = {f"mlp/{v}": build(MODELS / "plain_mlp.py", "1x2,8x2", output=out / f"mlp{v}",
                              name="mlp", model_version=str(v), config={"hidden": 4 * v},
                              progress=False).path for v in (1, 2)}
    made["clf/1"] = build(EXAMPLES / "plain_mlp.py", "1x4,8x4", output=out / "clf1", name="clf",
                          progress=False).path
    made["mlp/3"] = build(MODELS / "fails_in_serve.py", "1x2", output=out / "fails3", name="mlp",
                          model_version="3", progress=False).path
    return made


@pytest.fixture(scope="module")
def repo(built: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo") / "models"
    for label, _ in (("mlp/1", 0), ("mlp/2", 0), ("clf/1", 0)):
        shutil.copytree(built[label], root / label)
    (root / "clf" / "qkan-pack.toml").write_text("max_batch_size = 4\nmax_queued_requests = 3\n")
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    pytest.importorskip("tritonclient.grpc")
    with grpc_server(repo, [], tmp_path_factory.mktemp("token"), TOKEN,
                     env={"QKAN_PACK_TEST_FAIL_LOAD": "1"}, timeout_s=480) as running:
        yield running


@pytest.fixture(scope="module")
def predictors(built: dict[str, Path]) -> Iterator[dict[tuple[str, int], Predictor]]:
    loaded = {(m, v): Predictor.load(built[f"{m}/{v}"], "cpu", progress=False)
              for m, v in VERSIONS}
    yield loaded
    for predictor in loaded.values():
        predictor.close()


def _auth(key: str = "Authorization") -> dict[str, str]:
    return {key: f"Bearer {TOKEN}"}


def _clients(server: Server) -> tuple[Any, Any]:
    import tritonclient.grpc as grpc_client
    import tritonclient.http as http_client

    return (http_client.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=600,
                                              connection_timeout=600),
            grpc_client.InferenceServerClient(f"127.0.0.1:{server.grpc_port}"))


def _rows(model: str, count: int = 1) -> np.ndarray:
    return np.random.default_rng(count).random((count, 4 if model == "clf" else 2),
                                               dtype=np.float32)


def _input(module: Any, x: np.ndarray, name: str) -> Any:
    given = module.InferInput(name, list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    return given


def test_the_index_lists_every_model_version_ready(server: Server) -> None:
    http, grpc = _clients(server)
    expected = [{"name": m, "version": str(v), "state": "READY", "reason": ""}
                for m, v in sorted(VERSIONS)]
    assert http.get_model_repository_index(headers=_auth()) == expected
    index = grpc.get_model_repository_index(headers=_auth("authorization"), as_json=True)
    assert [(e["name"], e["version"], e["state"]) for e in index["models"]] == \
        [(e["name"], e["version"], "READY") for e in expected]
    assert "model_repository" in http.get_server_metadata(headers=_auth())["extensions"]
    status, listing = server.json("/")
    assert status == 200
    assert {m["name"]: m["default_version"] for m in listing["models"]} == {"mlp": "2",
                                                                            "clf": "1"}


def test_every_version_answers_as_its_predictor(server: Server,
                                                predictors: dict[tuple[str, int], Predictor]
                                                ) -> None:
    import tritonclient.grpc as grpc_module
    import tritonclient.http as http_module

    http, grpc = _clients(server)
    for (model, version), predictor in predictors.items():
        x = _rows(model, 8)  # a captured batch (a single row is batched: both are routes)
        want = predictor(x)
        name = predictor.manifest.input_names[0]
        status, body = server.json(f"/models/{model}/versions/{version}", {"inputs": x.tolist()})
        assert status == 200
        np.testing.assert_allclose(body["outputs"], want, rtol=1e-5, atol=1e-6)
        reply = http.infer(model, [_input(http_module, x, name)], model_version=str(version),
                           headers=_auth())
        np.testing.assert_allclose(reply.as_numpy("output"), want, rtol=1e-5, atol=1e-6)
        reply = grpc.infer(model, [_input(grpc_module, x, name)], model_version=str(version),
                           headers=_auth("authorization"))
        np.testing.assert_allclose(reply.as_numpy("output"), want, rtol=1e-5, atol=1e-6)
        assert reply.get_response().model_version == str(version)
    x = _rows("mlp")
    reply = grpc.infer("mlp", [_input(grpc_module, x, "input")], headers=_auth("authorization"))
    assert reply.get_response().model_version == "2"  # no version: the highest ready one
    np.testing.assert_allclose(reply.as_numpy("output"), predictors["mlp", 2](x), rtol=1e-5,
                               atol=1e-6)
    status, body = server.json("/models/mlp", {"inputs": x.tolist()})
    np.testing.assert_allclose(body["outputs"], predictors["mlp", 2](x), rtol=1e-5, atol=1e-6)
    assert http.get_model_metadata("mlp", headers=_auth())["versions"] == ["1", "2"]
    assert grpc.get_model_metadata("mlp", headers=_auth("authorization")).versions == ["1", "2"]
    assert http.get_model_metadata("mlp", "1", headers=_auth())["versions"] == ["1"]


def test_unknown_names_and_versions_are_404_and_not_found(server: Server) -> None:
    import tritonclient.grpc as grpc_module
    import tritonclient.http as http_module
    from tritonclient.utils import InferenceServerException

    http, grpc = _clients(server)
    x = _rows("mlp")
    for model, version in (("nope", ""), ("mlp", "7"), ("mlp", "x")):
        with pytest.raises(InferenceServerException) as info:
            http.infer(model, [_input(http_module, x, "input")], model_version=version,
                       headers=_auth())
        assert info.value.status() == "404", info.value
        with pytest.raises(InferenceServerException, match="NOT_FOUND"):
            grpc.infer(model, [_input(grpc_module, x, "input")], model_version=version,
                       headers=_auth("authorization"))
        assert not http.is_model_ready(model, version, headers=_auth())
        assert not grpc.is_model_ready(model, version, headers=_auth("authorization"))
    assert server.json("/models/nope", {"inputs": [[1, 2]]})[0] == 404
    assert server.json("/models/mlp/versions/1", {"inputs": [[1, 2]]}, token=None)[0] == 401
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        grpc.get_model_repository_index()


def test_triton_statistics_list_every_ready_version(server: Server) -> None:
    """``GET /v2/models/stats`` and gRPC ``ModelStatistics`` without a name (perf_analyzer's
    question): every ready version, each its replicas' sum; one version by name, each
    request it answered counted (they were 404 "unknown model 'stats'" and UNIMPLEMENTED)."""
    import tritonclient.http as http_module

    http, grpc = _clients(server)
    status, body = server.json("/v2/models/stats")
    assert status == 200
    listed = sorted((m["name"], m["version"]) for m in body["model_stats"])
    assert listed == [("clf", "1"), ("mlp", "1"), ("mlp", "2")]
    over_grpc = grpc.get_inference_statistics(headers=_auth("authorization"), as_json=True)
    assert sorted((m["name"], m["version"]) for m in over_grpc["model_stats"]) == listed

    def clf_successes() -> int:
        (entry,) = http.get_inference_statistics("clf", "1", headers=_auth())["model_stats"]
        return entry["inference_stats"]["success"]["count"]

    before = clf_successes()
    for _ in range(3):
        http.infer("clf", [_input(http_module, _rows("clf"), "x")], headers=_auth())
    assert clf_successes() - before == 3
    assert server.json("/v2/models/nope/stats")[0] == 404


def test_streaming_inference_is_unimplemented_after_the_token_check(server: Server) -> None:
    """``ModelStreamInfer`` with its requests sent whole (the stream closed after them):
    UNIMPLEMENTED, and UNAUTHENTICATED without the token (Ray's proxy answered UNKNOWN
    naming the router's own methods, either way)."""
    import grpc
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="mlp").SerializeToString()
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        for metadata, code in (((("authorization", f"Bearer {TOKEN}"),),
                                grpc.StatusCode.UNIMPLEMENTED),
                               (None, grpc.StatusCode.UNAUTHENTICATED)):
            with pytest.raises(grpc.RpcError) as info:
                list(stream(iter([request]), metadata=metadata, timeout=30))
            assert info.value.code() == code, info.value
            assert "Tried to call a method" not in (info.value.details() or "")


def test_a_models_config_file_is_applied(server: Server) -> None:
    status, clf = server.json("/models/clf")
    assert status == 200
    assert clf["serving"]["max_batch_size"] == 4 and clf["serving"]["max_queued"] == 3
    assert clf["oip"] == {"model": "clf", "version": "1"}
    mlp = server.json("/models/mlp/versions/1")[1]
    assert mlp["serving"]["max_batch_size"] == 8  # the command line's default: its largest batch


def _samples(server: Server) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    status, _, raw = server.request("/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(raw.decode()) for s in family.samples}


def _total(samples: dict[tuple[str, tuple], float], name: str, **labels: str) -> float:
    return sum(v for (sample, keys), v in samples.items()
               if sample == name and labels.items() <= dict(keys).items())


def test_metrics_are_labelled_by_model_and_version(server: Server) -> None:
    before = _samples(server)
    for _ in range(3):
        assert server.json("/models/mlp/versions/1", {"inputs": [[0.5, 0.5]]})[0] == 200
    server.json("/models/clf", {"inputs": [[1, 2, 3, 4]]})
    after = _samples(server)
    ok = {"name": "qkan_pack_requests_total", "outcome": "success", "protocol": "json"}

    def grew(**labels: str) -> float:
        return _total(after, **ok, **labels) - _total(before, **ok, **labels)

    assert grew(model="mlp", version="1") == 3 and grew(model="mlp", version="2") == 0
    assert grew(model="clf", version="1") == 1
    for model, version in VERSIONS:
        assert _total(after, "qkan_pack_repository_loads_total", model=model,
                      version=str(version), result="success") == 1
        assert _total(after, "qkan_pack_model_version_ready", model=model,
                      version=str(version)) == 1
    assert _total(after, "qkan_pack_scrape_replicas", state="answered") == 3


class _Traffic:
    """Requests to one model in a loop while the test works on others: none may fail, and
    each must be answered by the version expected (``predictor``'s answer)."""

    def __init__(self, server: Server, path: str, row: list[float], predictor: Predictor) -> None:
        self.server, self.path, self.row = server, path, row
        self.expected = predictor(np.array([row], np.float32))
        self.answered, self.failed = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            status, body = self.server.json(self.path, {"inputs": [self.row]})
            if status == 200 and np.allclose(body["outputs"], self.expected, rtol=1e-5,
                                             atol=1e-6):
                self.answered += 1
            else:
                self.failed.append((status, body))

    def __enter__(self) -> _Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def test_load_and_unload_leave_the_other_models_serving(
        server: Server, repo: Path, built: dict[str, Path],
        predictors: dict[tuple[str, int], Predictor]) -> None:
    """Unloading and loading ``clf``, a reload of ``mlp`` with new settings, and two loads of
    ``mlp`` that fail: the traffic to the other model never fails, a failed version never
    replaces the serving one, and each failure is said (the load's error, the index)."""
    from tritonclient.utils import InferenceServerException

    http, grpc = _clients(server)
    grpc_auth = _auth("authorization")
    with _Traffic(server, "/models/mlp", [0.25, 0.75], predictors["mlp", 2]) as mlp_traffic:
        http.unload_model("clf", headers=_auth())
        assert not http.is_model_ready("clf", headers=_auth())
        status, body = server.json("/models/clf", {"inputs": [[1, 2, 3, 4]]})
        assert status == 404 and "is not loaded" in body["error"]
        assert {"name": "clf", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in \
            http.get_model_repository_index(headers=_auth())
        x = _rows("mlp")
        status, body = server.json("/", {"inputs": x.tolist()})  # one model left: POST / is it
        assert status == 200
        np.testing.assert_allclose(body["outputs"], predictors["mlp", 2](x), rtol=1e-5,
                                   atol=1e-6)
        grpc.load_model("clf", headers=grpc_auth)
        assert grpc.is_model_ready("clf", headers=grpc_auth)
    assert mlp_traffic.failed == [] and mlp_traffic.answered > 0

    with _Traffic(server, "/models/clf", [1.0, 2.0, 3.0, 4.0], predictors["clf", 1]) \
            as clf_traffic, _Traffic(server, "/models/mlp", [0.25, 0.75],
                                     predictors["mlp", 2]) as reloaded_traffic:
        (repo / "mlp" / "qkan-pack.toml").write_text("max_batch_size = 2\n")
        http.load_model("mlp", headers=_auth())  # new settings: a new generation of each
        assert server.json("/models/mlp/versions/1")[1]["serving"]["max_batch_size"] == 2

        shutil.copytree(built["mlp/3"], repo / "mlp" / "3")
        with pytest.raises(InferenceServerException, match=r"mlp/3: .*told to fail its load"):
            http.load_model("mlp", headers=_auth())
        shutil.rmtree(repo / "mlp" / "3")
        shutil.copytree(built["clf/1"], repo / "mlp" / "3")
        with pytest.raises(InferenceServerException,
                           match="mlp/3: its manifest names model 'clf'"):
            grpc.load_model("mlp", headers=grpc_auth)
        state = {(e["name"], e["version"]): e for e in
                 http.get_model_repository_index(headers=_auth())}
        assert state["mlp", "3"]["state"] == "UNAVAILABLE"
        assert "names model 'clf'" in state["mlp", "3"]["reason"]
        assert state["mlp", "2"]["state"] == "READY"
        x = _rows("mlp")
        reply = server.json("/models/mlp", {"inputs": x.tolist()})[1]  # still version 2
        np.testing.assert_allclose(reply["outputs"], predictors["mlp", 2](x), rtol=1e-5,
                                   atol=1e-6)
        shutil.rmtree(repo / "mlp" / "3")
        http.load_model("mlp", headers=_auth())  # its directory as it was: 3 forgotten
    assert clf_traffic.failed == [] and clf_traffic.answered > 0
    assert reloaded_traffic.failed == [] and reloaded_traffic.answered > 0  # the model reloaded
    index = http.get_model_repository_index(headers=_auth())
    assert [(e["name"], e["version"], e["state"]) for e in index] == [
        ("clf", "1", "READY"), ("mlp", "1", "READY"), ("mlp", "2", "READY")]
    samples = _samples(server)
    assert _total(samples, "qkan_pack_repository_loads_total", model="mlp", version="3",
                  result="failure") == 2
    assert _total(samples, "qkan_pack_repository_loads_total", model="clf", version="1",
                  result="success") == 2


def _replicas_of(server: Server, app_prefix: str) -> list[int]:
    """The replica processes of the applications whose name starts with ``app_prefix``."""
    found = []
    for pid in server.replica_pids():
        with contextlib.suppress(OSError):
            if f"ServeReplica:{app_prefix}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def _index_entry(server: Server, model: str, version: str) -> dict[str, str]:
    status, index = server.json("/v2/repository/index", {})
    assert status == 200
    return next(e for e in index if (e["name"], e["version"]) == (model, version))


def test_a_version_whose_replicas_are_down_is_unavailable_at_once(
        server: Server, repo: Path, predictors: dict[tuple[str, int], Predictor]) -> None:
    """Version 1 of ``mlp`` loses its replica, and its replacement cannot load (a changed
    weights file on disk): the index says UNAVAILABLE with Ray's reason, its requests are
    refused at once (they waited 60 s each for a replica that never came, the version
    still READY), its ready check says no, the model's other version serves; once the file
    is back and a replica runs again, version 1 is READY and answers."""
    import tritonclient.grpc as grpc_client

    weights = repo / "mlp" / "1" / "weights.safetensors"
    kept = weights.read_bytes()
    broken = bytearray(kept)
    broken[-1] ^= 0xFF
    weights.write_bytes(bytes(broken))
    try:
        pids = _replicas_of(server, "mlp.v1.")
        assert pids, "no replica of mlp version 1 found"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (entry := _index_entry(server, "mlp", "1"))["state"] == "READY":
            assert time.monotonic() < deadline, "mlp/1 still READY 60 s after its replica died"
            time.sleep(0.5)
        assert entry["state"] == "UNAVAILABLE" and "no replica running" in entry["reason"]
        x = _rows("mlp")
        started = time.monotonic()
        status, body = server.json("/models/mlp/versions/1", {"inputs": x.tolist()})
        assert status == 503 and "has no replica running" in body["error"]
        _, grpc = _clients(server)
        with pytest.raises(grpc_client.InferenceServerException, match="UNAVAILABLE"):
            grpc.infer("mlp", [_input(grpc_client, x, "x")], model_version="1",
                       headers=_auth("authorization"))
        assert time.monotonic() - started < 10  # at once, not after a 60-s wait each
        assert server.json("/v2/models/mlp/versions/1/ready")[0] == 400
        assert server.json("/v2/health/ready") == (200, {"ready": True})  # mlp 2 serves
        status, body = server.json("/models/mlp", {"inputs": x.tolist()})
        assert status == 200
        np.testing.assert_allclose(body["outputs"], predictors["mlp", 2](x), rtol=1e-5,
                                   atol=1e-6)
        ready = {dict(k)["state"]: v for (name, k), v in _samples(server).items()
                 if name == "qkan_pack_model_version_ready"
                 and (dict(k)["model"], dict(k)["version"]) == ("mlp", "1")}
        assert ready == {"UNAVAILABLE": 0.0}
    finally:
        weights.write_bytes(kept)
    deadline = time.monotonic() + 180  # Ray starts the replica again, after its back-off
    while _index_entry(server, "mlp", "1")["state"] != "READY":
        assert time.monotonic() < deadline, "mlp/1 not READY again 180 s after the file came back"
        time.sleep(1)
    status, body = server.json("/models/mlp/versions/1", {"inputs": x.tolist()})
    assert status == 200
    np.testing.assert_allclose(body["outputs"], predictors["mlp", 1](x), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def python_ingress(built: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Server]:
    """A repository of one model through Ray's Python proxy (no HAProxy routes), behind a
    token; a body timeout of 5 s bounds what the router waits for a version's answer (10 s,
    ``forward_timeout_s``)."""
    root = tmp_path_factory.mktemp("one") / "models"
    shutil.copytree(built["mlp/1"], root / "mlp" / "1")
    with grpc_server(root, ["--ingress", "python", "--body-timeout-s", "5"],
                     tmp_path_factory.mktemp("token"), TOKEN, timeout_s=480) as running:
        yield running


def test_through_the_python_proxy_the_router_passes_requests_on(
        python_ingress: Server, predictors: dict[tuple[str, int], Predictor]) -> None:
    import tritonclient.grpc as grpc_module
    import tritonclient.http as http_module

    x = _rows("mlp", 1)
    want = predictors["mlp", 1](x)
    for path in ("/", "/models/mlp", "/models/mlp/versions/1"):
        status, body = python_ingress.json(path, {"inputs": x.tolist()})
        assert status == 200, (path, body)
        np.testing.assert_allclose(body["outputs"], want, rtol=1e-5, atol=1e-6)
    http, grpc = _clients(python_ingress)
    reply = http.infer("mlp", [_input(http_module, x, "input")], headers=_auth())
    np.testing.assert_allclose(reply.as_numpy("output"), want, rtol=1e-5, atol=1e-6)
    reply = grpc.infer("mlp", [_input(grpc_module, x, "input")], model_version="1",
                       headers=_auth("authorization"))
    np.testing.assert_allclose(reply.as_numpy("output"), want, rtol=1e-5, atol=1e-6)
    assert python_ingress.json("/v2/models/mlp/versions/2/infer", {"inputs": []})[0] == 404
    from tritonclient.utils import InferenceServerException

    for call, code in ((lambda: grpc.get_model_repository_index(), "UNAUTHENTICATED"),
                       (lambda: grpc.infer("mlp", [_input(grpc_module, x, "input")],
                                           headers={"authorization": "Bearer wrong-token-00000"}),
                        "UNAUTHENTICATED"),
                       (lambda: grpc.get_system_shared_memory_status(
                           headers=_auth("authorization")), "UNIMPLEMENTED")):
        with pytest.raises(InferenceServerException) as info:  # not INTERNAL, Ray's traceback
            call()
        assert info.value.status() == f"StatusCode.{code}", info.value
        assert "ray::" not in str(info.value)
    samples = _samples(python_ingress)
    assert _total(samples, "qkan_pack_requests_total", model="mlp", version="1",
                  outcome="success") == 5
    every = grpc.get_inference_statistics(headers=_auth("authorization"), as_json=True)
    assert sorted((m["name"], m["version"]) for m in every["model_stats"]) == [("mlp", "1")]
    assert int(every["model_stats"][0]["inference_count"]) >= 5


def test_unloading_answers_the_calls_in_flight_to_its_version(python_ingress: Server) -> None:
    """Calls to a named version while it unloads, over gRPC and HTTP through the router's
    hop: each is answered (served, or 503 / UNAVAILABLE, then 404 / NOT_FOUND once it is
    gone), none waits for its deadline. Before, a call resolved to the generation being
    deleted never got an answer."""
    import tritonclient.grpc as grpc_module
    from tritonclient.utils import InferenceServerException

    http, grpc = _clients(python_ingress)
    x = _rows("mlp")
    outcomes: list[str] = []
    stop = threading.Event()

    def grpc_calls() -> None:
        while not stop.is_set():
            try:
                grpc.infer("mlp", [_input(grpc_module, x, "input")], model_version="1",
                           headers=_auth("authorization"), client_timeout=30)
                outcomes.append("OK")
            except InferenceServerException as exc:
                outcomes.append(str(exc.status()))

    def http_calls() -> None:
        while not stop.is_set():
            try:
                outcomes.append(str(python_ingress.request(
                    "/models/mlp/versions/1", json.dumps({"inputs": x.tolist()}).encode(),
                    timeout=30)[0]))
            except OSError as exc:  # a timeout: the call was never answered
                outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=grpc_calls), threading.Thread(target=http_calls)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        http.unload_model("mlp", headers=_auth())
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    http.load_model("mlp", headers=_auth())
    assert not any(thread.is_alive() for thread in threads)
    assert set(outcomes) <= {"OK", "200", "StatusCode.UNAVAILABLE", "503",
                             "StatusCode.NOT_FOUND", "404"}, outcomes
    assert {"OK", "200"} <= set(outcomes) and set(outcomes) & {"404", "503"}, outcomes

