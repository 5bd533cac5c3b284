"""``qkan_pack.serve:app_builder`` (issue 35: a KubeRay ``RayService`` deploys its
``serveConfigV2``): the arguments read and refused, and a Serve config file run by Ray's own
``serve run``, answering as ``qkan-pack serve`` does, token and protocol included."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qkan_pack import Predictor, read_artifact
from qkan_pack.errors import ServeError
from qkan_pack.serve._builder import options_from, read_args

from ._server import TAG_ENV, free_port, tagged_pids

TOKEN = "builder-token-0123456789abcdef"


def test_arguments_are_read_from_yaml_or_command_line_text(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    read = read_args({"artifact": "/models/m", "replicas": "2", "exact": "true",
                      "max_body_mb": 1, "token_file": str(token), "name": "mlp"})
    options = options_from(read)
    assert (options.replicas, options.exact, options.model_name) == (2, True, "mlp")
    assert options.limits.max_body_bytes == 2**20
    import hashlib

    assert options.limits.token_sha256 == hashlib.sha256(TOKEN.encode()).hexdigest()


@pytest.mark.parametrize(("args", "says"), [
    ({"artifact": "a", "replica": 2}, "unknown argument(s) ['replica']"),
    ({"replicas": 2}, "give the artifact's directory"),
    ({"artifact": "a", "replicas": "two"}, "argument replicas='two'"),
    ({"artifact": "a", "exact": "maybe"}, "not true or false"),
    ({"artifact": "a", "exact": 1}, "exact=1: not true or false"),
    ({"artifact": "a", "exact": "yes"}, "exact='yes': not true or false"),
    ({"artifact": "a", "max_body_mb": "nan"}, "not a finite number"),
    ({"artifact": "a", "token_sha256": "abc"}, "64 lowercase hex digits"),
    ({"artifact": "a", "replicas": 0}, "replicas=0: outside [1, 1000]"),
    ({"artifact": "a", "name": "a/b"}, "a model name is letters"),
    ({"artifact": "a", "precision": "fp8"}, "give recorded or one of fp32, tf32, bf16, fp16"),
    ({"artifact": "a", "name": None}, "argument name=None: not text"),
    ({"artifact": "a", "replicas": 1.7}, "not a whole number"),
    ({"artifact": "a", "max_batch_size": True}, "not a whole number"),
    ({"artifact": "a", "body_timeout_s": 0}, "outside [0.1, 86400]"),
])
def test_bad_arguments_are_refused_naming_them(args: dict, says: str) -> None:
    with pytest.raises(ServeError) as info:
        options_from(read_args(args))
    assert says in str(info.value)


@pytest.mark.parametrize("field", ["grace_s", "gpus_per_replica", "cpus_per_replica"])
@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0])
def test_serve_options_refuse_a_drain_or_a_share_that_is_not_finite(field: str,
                                                                     value: float) -> None:
    """``ServeOptions(grace_s=inf)`` was taken: a drain that never ends (the command line
    refuses it before Ray starts; the Python API now does too)."""
    from qkan_pack.serve import ServeOptions

    bound = "<= 3600" if field == "grace_s" else "< inf"  # a drain is bounded further
    with pytest.raises(ServeError, match=f"need 0 <= {field} {bound}"):
        ServeOptions(**{field: value})


def test_an_artifact_whose_digest_differs_is_refused_before_any_replica(artifact: Path) -> None:
    pytest.importorskip("ray")
    from qkan_pack.errors import DigestMismatchError
    from qkan_pack.serve import app_builder

    with pytest.raises(DigestMismatchError):
        app_builder({"artifact": str(artifact), "digest": "sha256:" + "0" * 64})


@pytest.mark.serve
@pytest.mark.slow
def test_a_serve_config_file_runs_the_artifact_with_its_token(artifact: Path,
                                                              tmp_path: Path) -> None:
    """What a RayService's serveConfigV2 holds, run by Ray's ``serve run``."""
    pytest.importorskip("ray")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    port, grpc_port = free_port(), free_port()
    digest = read_artifact(artifact).digest
    config = tmp_path / "serve.json"  # Serve config files are YAML, of which JSON is a part
    config.write_text(json.dumps({
        "http_options": {"host": "127.0.0.1", "port": port},
        "grpc_options": {"port": grpc_port,
                         "grpc_servicer_functions": ["qkan_pack.serve.add_inference_service"]},
        "applications": [{"name": "qkan-pack", "route_prefix": "/",
                          "import_path": "qkan_pack.serve:app_builder",
                          "args": {"artifact": str(artifact), "digest": digest,
                                   "token_file": str(token), "name": "mlp", "device": "cpu"}}],
    }))
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG_ENV: tag, "RAY_SERVE_LOG_TO_STDERR": "0"}
    process = subprocess.Popen(
        [sys.executable, "-c", "from ray.serve.scripts import cli; cli()", "run", str(config)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        x = np.random.default_rng(0).random((1, 2), dtype=np.float32)
        reply = _wait_for(f"http://127.0.0.1:{port}/", {"inputs": x.tolist()}, process)
        with Predictor.load(artifact, "cpu") as predictor:
            np.testing.assert_allclose(np.array(reply["outputs"], np.float32), predictor(x),
                                       rtol=1e-5, atol=1e-6)
        status, _ = _post(f"http://127.0.0.1:{port}/", {"inputs": x.tolist()}, token=None)
        assert status == 401
        status, body = _post(f"http://127.0.0.1:{port}/v2/models/mlp/infer", {"inputs": [
            {"name": "x", "shape": [1, 2], "datatype": "FP32", "data": x.ravel().tolist()}]})
        assert status == 200 and body["outputs"][0]["shape"] == [1, 2]
        grpc_client = pytest.importorskip("tritonclient.grpc")
        client = grpc_client.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        given = grpc_client.InferInput("x", [1, 2], "FP32")
        given.set_data_from_numpy(x)
        result = client.infer("mlp", [given], headers={"authorization": f"Bearer {TOKEN}"})
        np.testing.assert_allclose(result.as_numpy("output"), np.array(reply["outputs"],
                                                                       np.float32), rtol=1e-6)
    finally:
        process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
        for pid in tagged_pids(tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _post(url: str, payload: Any, token: str | None = TOKEN) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, _json_or_text(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _json_or_text(exc.read())


def _json_or_text(body: bytes) -> Any:
    """A reply's JSON; Ray's proxy answers in plain text while the app deploys."""
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


def _wait_for(url: str, payload: Any, process: subprocess.Popen, timeout_s: float = 240) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"serve run exited {process.returncode}: "
                                 f"{process.stderr.read()[-3000:]}")
        try:
            status, body = _post(url, payload)
            if status == 200:
                return body
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError("serve run did not answer in time")


def test_replicas_load_at_the_precision_asked() -> None:
    from qkan_pack.serve._settings import load_options

    assert load_options([], "recorded") is None
    assert load_options(["k.pem"], "bf16") == {"trusted_keys": ["k.pem"], "precision": "bf16"}
    assert load_options([], "recorded", "auto") is None  # the defaults are not passed
    assert load_options([], "recorded", "off") == {"compiled": "off"}
