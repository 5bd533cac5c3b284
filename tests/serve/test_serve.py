"""Ray Serve deployment on a local Ray instance: HTTP and handle round trips, batching into
captured shapes, rejections, readiness. One Ray instance and one replica for the module."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'qkan-pack[serve]')")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed")

from qkan_pack.errors import InputError  # noqa: E402

pytestmark = [pytest.mark.serve, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BODY_LIMIT = 64 * 1024


@dataclass
class Served:
    url: str
    handle: Any
    artifact: Path
    digest: str
    statuses: list[str]
    running_seen_at: float


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Build a 1x2,8x2 artifact, start Ray and the app in a thread, and watch its status
    until RUNNING (to show the app is not RUNNING before the replica has loaded)."""
    from qkan_pack import build
    from qkan_pack.serve import build_app

    artifact = tmp_path_factory.mktemp("serve") / "qkan_mlp"
    result = build(ROOT / "examples" / "qkan_mlp.py", "1x2,8x2", output=artifact)
    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app(artifact, max_batch_wait_ms=50, max_body_bytes=BODY_LIMIT,
                        cpus_per_replica=0.5)
        handles: list[Any] = []
        thread = threading.Thread(target=lambda: handles.append(serve.run(
            app, name="test", route_prefix="/",
            logging_config={"enable_access_log": False, "log_level": "WARNING"})))
        thread.start()
        statuses: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            app_status = serve.status().applications.get("test")
            statuses.append(str(app_status.status.value) if app_status else "ABSENT")
            if statuses[-1] == "RUNNING":
                break
            time.sleep(0.05)
        running_seen_at = time.time()
        thread.join(timeout=60)
        assert handles, f"serve.run did not return; statuses {statuses[-5:]}"
        yield Served(f"http://127.0.0.1:{port}", handles[0], artifact, result.digest, statuses,
                     running_seen_at)
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def predictor(served: Served) -> Any:
    from qkan_pack import Predictor

    with Predictor.load(served.artifact, "cpu") as loaded:
        yield loaded


def _request(url: str, body: bytes | None = None, method: str | None = None
             ) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _post(served: Served, payload: Any) -> tuple[int, dict[str, Any]]:
    return _request(served.url + "/", json.dumps(payload).encode())


def _rows(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (count, 2)).astype(np.float32)


def _close(got: Any, want: Any) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), want, rtol=1e-5, atol=1e-6)


def test_ready_only_after_the_replica_loaded(served: Served) -> None:
    before = served.statuses[:-1]
    assert served.statuses[-1] == "RUNNING"
    assert before and "RUNNING" not in before, served.statuses
    status, described = _request(served.url + "/")
    replica = described["replica"]
    assert status == 200
    assert replica["ready_at"] <= served.running_seen_at
    assert replica["captured"] == ["1x2", "8x2"]
    assert replica["load_to_ready_seconds"] > 0
    served.handle.check_health.remote().result()


def test_get_describes_the_artifact(served: Served) -> None:
    status, described = _request(served.url + "/")
    assert status == 200
    assert described["digest"] == served.digest
    assert described["inputs"] == [{"name": "x", "dtype": "float32"}]
    assert [s["inputs"] for s in described["shapes"]] == [{"x": [1, 2]}, {"x": [8, 2]}]
    assert described["capture_policy"] == "auto"
    assert described["rows"] == [{"row": {"x": [2]}, "captured_batches": [1, 8]}]


def test_single_rows_round_trip_in_both_forms(served: Served, predictor: Any) -> None:
    row = _rows(1)
    want = predictor(row)
    status, reply = _post(served, {"inputs": row.tolist()})
    assert status == 200
    _close(reply["outputs"], want)
    status, reply = _post(served, {"inputs": row[0].tolist()})
    assert status == 200
    assert np.asarray(reply["outputs"]).shape == (2,)
    _close(reply["outputs"], want[0])


def test_concurrent_rows_are_packed_into_captured_batches(served: Served, predictor: Any) -> None:
    rows = _rows(16, seed=1)
    served.handle.stats.remote(reset=True).result()
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda r: _post(served, {"inputs": [r.tolist()]}), rows))
    stats = served.handle.stats.remote().result()
    assert all(status == 200 for status, _ in replies), replies
    for row, (_, reply) in zip(rows, replies):
        _close(reply["outputs"], predictor(row[None]))
    assert stats["requests"]["rows"] == 16
    assert stats["rows_replayed"] == 16
    assert set(stats["replays"]) <= {"1x2", "8x2"}
    assert sum(stats["replays"].values()) < 16, stats  # rows shared replays
    assert max(int(k) for k in stats["rows_per_replay"]) > 1, stats


def test_a_captured_batch_passes_through(served: Served, predictor: Any) -> None:
    rows = _rows(8, seed=2)
    served.handle.stats.remote(reset=True).result()
    status, reply = _post(served, {"inputs": rows.tolist()})
    assert status == 200
    _close(reply["outputs"], predictor(rows))
    stats = served.handle.stats.remote().result()
    assert stats["requests"]["direct"] == 1 and stats["direct_shapes"] == {"8x2": 1}


def test_base64_in_and_out(served: Served, predictor: Any) -> None:
    rows = _rows(8, seed=3)
    tensor = {"b64": base64.b64encode(rows.astype("<f4").tobytes()).decode(),
              "dtype": "float32", "shape": [8, 2]}
    status, reply = _post(served, {"inputs": {"x": tensor}, "encoding": "base64"})
    assert status == 200
    out = reply["outputs"]
    assert out["dtype"] == "float32" and out["shape"] == [8, 2]
    got = np.frombuffer(base64.b64decode(out["b64"]), "<f4").reshape(8, 2)
    _close(got, predictor(rows))


def test_handle_predict(served: Served, predictor: Any) -> None:
    row, batch = _rows(1, seed=4), _rows(8, seed=5)
    got = served.handle.predict.remote(row).result()
    assert isinstance(got, np.ndarray) and got.shape == (1, 2)
    _close(got, predictor(row))
    _close(served.handle.predict.remote(x=batch).result(), predictor(batch))
    with pytest.raises(InputError, match=re.escape("accepted: 1x2 float32 | 8x2 float32")):
        served.handle.predict.remote(_rows(3)).result()


@pytest.mark.parametrize(("body", "status", "message"), [
    (b'{"inputs": [[0.1, 0.2]', 400, "not valid JSON"),
    (b'{"input": [[0.1, 0.2]]}', 400, '"inputs"'),
    (b'{"inputs": [[0.1], [0.2, 0.3]]}', 400, "rectangular"),
    (b'{"inputs": [["a", "b"]]}', 400, "numbers"),
    (b'{"inputs": {"b64": "!!", "dtype": "float32", "shape": [1, 2]}}', 400, "base64"),
    (b'{"inputs": [[0.1, 0.2]], "encoding": "hex"}', 400, "encoding"),
    (b'{"inputs": [[true, false]]}', 422, "float32"),
    (b'{"inputs": {"b64": "AAAAAAAAAAAAAAAAAAAAAA==", "dtype": "float64", "shape": [1, 2]}}',
     422, "sent as float64"),
    (b'{"inputs": [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]}', 422, "3x2 is not accepted"),
    (b'{"inputs": [0.1, 0.2, 0.3]}', 422, "accepted: 1x2 float32 | 8x2 float32"),
    (b'{"inputs": {"y": [[0.1, 0.2]]}}', 422, "unknown ['y']"),
])
def test_bad_requests_are_rejected_with_a_reason(served: Served, body: bytes, status: int,
                                                 message: str) -> None:
    got, reply = _request(served.url + "/", body)
    assert got == status, reply
    assert message in reply["error"]
    if status == 422:
        assert reply["accepted"] == ["x 1x2 float32", "x 8x2 float32"]


def test_oversize_body_and_bad_routes(served: Served) -> None:
    status, reply = _request(served.url + "/", b"[" + b"0.5," * BODY_LIMIT + b"0]")
    assert status == 413 and str(BODY_LIMIT) in reply["error"]
    assert _request(served.url + "/nowhere")[0] == 404
    assert _request(served.url + "/", b"{}", method="PUT")[0] == 405
    status, reply = _request(served.url + "/stats")
    assert status == 200 and reply["requests"]["rejected"] >= 1


def test_a_crashed_replica_is_replaced_while_the_other_serves(served: Served,
                                                              predictor: Any) -> None:
    """The last Ray test: the replacement replica may still be loading at teardown."""
    from qkan_pack.serve import build_app

    handle = serve.run(build_app(served.artifact, replicas=2, cpus_per_replica=0.5),
                       name="crash", route_prefix="/crash",
                       logging_config={"enable_access_log": False, "log_level": "WARNING"})
    pids = {handle.describe.remote().result()["replica"]["pid"] for _ in range(40)}
    assert len(pids) == 2, pids
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    row, served_after, states = _rows(1, seed=6), 0, {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (served_after >= 20 and "STARTING" in states):
        _close(handle.predict.remote(row).result(), predictor(row))
        served_after += 1
        states = serve.status().applications["crash"].deployments["QkanPack"].replica_states
    assert "STARTING" in states, states  # Ray is bringing up a replacement
    assert served_after >= 20  # and every call meanwhile was answered by the survivor


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int64", "uint8", "bool"])
def test_base64_codec_round_trips_every_wire_dtype(dtype: str) -> None:
    import torch

    from qkan_pack.runtime import torch_dtype
    from qkan_pack.serve import encode_outputs, fit, parse_tensor

    tensor = (torch.arange(-3, 3).reshape(2, 3) % (2 if dtype == "bool" else 256)).to(torch_dtype(dtype))
    encoded = encode_outputs(tensor, "base64")
    assert encoded["dtype"] == dtype and encoded["shape"] == [2, 3]
    back = fit(parse_tensor(encoded, "inputs"), "x", dtype, "")
    assert back.dtype == tensor.dtype and torch.equal(back, tensor)
    listed = fit(parse_tensor(encode_outputs(tensor, "list"), "inputs"), "x", dtype, "")
    assert torch.equal(listed, tensor)


@pytest.mark.parametrize(("value", "want", "message"), [
    ([1.5, 2.0], "int64", "holds floats"),
    ([2**40], "int32", "outside the int32 range"),
    ([1, 0], "bool", "holds integers"),
])
def test_json_numbers_that_do_not_fit_the_dtype(value: list, want: str, message: str) -> None:
    from qkan_pack.serve import fit, parse_tensor

    with pytest.raises(InputError, match=message):
        fit(parse_tensor(value, "inputs"), "x", want, "")
