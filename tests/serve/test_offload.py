"""Large bodies parsed, and large replies encoded, in the replica's helper process: the same
answers as in process, never in the replica's own interpreter, and a helper that dies costs
no request and never outlives its replica."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qkan_pack.errors import MalformedRequestError

from ._server import strict_json

orjson = pytest.importorskip("orjson", reason="the serve extra is not installed")
pytestmark = pytest.mark.serve


def _rows(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (count, 2)).astype(np.float32)


def _post(body: bytes, path: str = "/", headers: tuple[tuple[bytes, bytes], ...] = ()) -> Any:
    """A POST as Ray's replica hands it over: the whole body in one ASGI message."""
    from starlette.requests import Request

    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": path, "headers": [
        (b"content-length", str(len(body)).encode()), *headers]}, receive)


def _forbidden(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a large body was parsed or encoded in the replica's process")


def test_large_bodies_and_replies_never_run_in_the_replica_process(tmp_path: Path,
                                                                   monkeypatch: Any) -> None:
    """Before, a large body was parsed in a worker thread of the replica: orjson and numpy
    hold the GIL throughout, so the event loop stood still for the whole parse (single-row
    p99 5.6 -> 177 ms on the 2-core CPU while 7 MB bodies arrived). Now this process's
    parse and encode are never called for them, and the answer is the predictor's."""
    import torch

    from qkan_pack import build
    from qkan_pack.serve import _http
    from qkan_pack.serve._app import ArtifactServer, ServeOptions

    from ..conftest import EXAMPLES

    build(EXAMPLES / "qkan_mlp.py", "1x2,4096x2", output=tmp_path / "a")
    server = ArtifactServer(str(tmp_path / "a"), options=ServeOptions(device="cpu"))
    rows = _rows(4096)
    body = orjson.dumps({"inputs": rows.tolist()})
    assert len(body) >= _http.INLINE_PARSE_BYTES
    monkeypatch.setattr(_http, "parse_request", _forbidden)
    monkeypatch.setattr(_http, "encode_reply", _forbidden)
    reply = asyncio.run(server(_post(body)))
    assert reply.status_code == 200, reply.body[:300]
    got = np.asarray(strict_json(reply.body)["outputs"], np.float32)
    want = server.predictor(torch.from_numpy(rows)).numpy()
    assert got.nbytes >= _http.INLINE_ENCODE_BYTES
    np.testing.assert_array_equal(got, want)
    helper = server.http._helper.pid
    assert helper is not None and helper != os.getpid()
    server.http._helper.close()


def test_a_large_protocol_body_is_parsed_in_the_helper_too(tmp_path: Path,
                                                           monkeypatch: Any) -> None:
    """Audit M5: ``/v2/.../infer`` parsed every body on the replica's event loop, so one 8 MB
    JSON body held every other request for seconds. Its JSON now goes to the helper by the
    rule of ``POST /``; a binary-extension body whose JSON header is small is still read in
    place (its tensors need no parse, and the round trip would copy them twice)."""
    import torch

    from qkan_pack import build
    from qkan_pack.serve import _http
    from qkan_pack.serve._app import ArtifactServer, ServeOptions
    from qkan_pack.serve._oip import OipModel

    from ..conftest import EXAMPLES

    build(EXAMPLES / "qkan_mlp.py", "1x2,4096x2", output=tmp_path / "a")
    server = ArtifactServer(str(tmp_path / "a"), options=ServeOptions(device="cpu"))
    path = f"/v2/models/{server.oip.name}/infer"
    rows = _rows(4096)
    want = server.predictor(torch.from_numpy(rows)).numpy()
    tensor = {"name": "x", "shape": list(rows.shape), "datatype": "FP32"}
    body = orjson.dumps({"id": "a:b", "inputs": [{**tensor, "data": rows.ravel().tolist()}]})
    assert len(body) >= _http.INLINE_PARSE_BYTES
    in_place = OipModel.parse_http
    monkeypatch.setattr(OipModel, "parse_http", _forbidden)
    reply = asyncio.run(server(_post(body, path)))
    assert reply.status_code == 200, reply.body[:300]
    (output,) = strict_json(reply.body)["outputs"]
    np.testing.assert_array_equal(np.asarray(output["data"], np.float32), want.ravel())

    monkeypatch.setattr(OipModel, "parse_http", in_place)
    monkeypatch.setattr(server.http._helper, "parse_infer", _forbidden)
    header = orjson.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": rows.nbytes}}]})
    reply = asyncio.run(server(_post(header + rows.tobytes(), path, (
        (b"inference-header-content-length", str(len(header)).encode()),))))
    assert reply.status_code == 200, reply.body[:300]
    (output,) = strict_json(reply.body)["outputs"]
    np.testing.assert_array_equal(np.asarray(output["data"], np.float32), want.ravel())
    server.http._helper.close()


def test_a_large_compressed_protocol_body_inflates_off_the_event_loop(
        tmp_path: Path, monkeypatch: Any) -> None:
    """A gzip ``/v2`` body was inflated on the replica's event loop, whatever its size: up to
    ``--max-body-mb`` of inflation held every other request. One of at least
    ``INLINE_INFLATE_BYTES`` compressed now inflates in a worker thread (zlib lets the GIL
    go), a smaller one in place; both answer as the body sent plain."""
    import gzip
    import threading

    from qkan_pack import build
    from qkan_pack.serve import _http
    from qkan_pack.serve._app import ArtifactServer, ServeOptions

    from ..conftest import MODELS

    build(MODELS / "plain_mlp.py", "1x2", output=tmp_path / "a", progress=False)
    server = ArtifactServer(str(tmp_path / "a"), options=ServeOptions(device="cpu"))
    path = f"/v2/models/{server.oip.name}/infer"
    inflated_on: list[bool] = []
    inflate = _http.decompressed

    def watched(*args: Any) -> Any:
        inflated_on.append(threading.current_thread() is threading.main_thread())
        return inflate(*args)

    monkeypatch.setattr(_http, "decompressed", watched)
    replies = []
    for request_id in ("small", os.urandom(2048).hex()):  # random hex: ~2 KiB compressed
        plain = orjson.dumps({"id": request_id, "inputs": [
            {"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [0.25, -0.5]}]})
        body = gzip.compress(plain)
        assert (len(body) >= _http.INLINE_INFLATE_BYTES) == (request_id != "small")
        compressed = asyncio.run(server(_post(body, path, ((b"content-encoding", b"gzip"),))))
        assert compressed.status_code == 200, compressed.body[:300]
        replies.append((compressed.body, asyncio.run(server(_post(plain, path))).body))
    assert inflated_on == [True, False]  # the small body in place, the large one off the loop
    assert all(compressed == plain for compressed, plain in replies)
    server.http._helper.close()


@pytest.fixture
def helper() -> Any:
    from qkan_pack.serve._offload import WireHelper

    made = WireHelper()
    yield made
    made.close()


@pytest.mark.parametrize("body", [
    orjson.dumps({"inputs": _rows(3000).tolist()}),
    orjson.dumps({"inputs": {"x": _rows(2, 1).tolist()}, "encoding": "base64"}),
    b'{"inputs": [[NaN, 0.5]]}',  # the lenient re-read: fit names the input later (422)
])
def test_the_helper_parses_as_the_replica_would(helper: Any, body: bytes) -> None:
    from qkan_pack.serve._wire import parse_request

    (given, encoding), (want, want_encoding) = helper.run("parse", body, ("x",)), \
        parse_request(body, ("x",))
    assert encoding == want_encoding and given.keys() == want.keys()
    assert given["x"].dtype == want["x"].dtype
    np.testing.assert_array_equal(given["x"].array, want["x"].array)


@pytest.mark.parametrize("body", [b'{"inputs": [[1, 2], [3]]}', b'{"inputs": 1, "inputs": 2}',
                                  b'{"outputs": []}', b"\xff"])
def test_a_bad_body_gets_the_same_error_from_the_helper(helper: Any, body: bytes) -> None:
    from qkan_pack.serve._wire import parse_request

    with pytest.raises(MalformedRequestError) as here:
        parse_request(body, ("x",))
    with pytest.raises(MalformedRequestError) as there:
        helper.run("parse", body, ("x",))
    assert str(there.value) == str(here.value)


@pytest.mark.parametrize("encoding", ["list", "base64"])
def test_the_helper_encodes_as_the_replica_would(helper: Any, encoding: str) -> None:
    from qkan_pack.serve._wire import encode_reply

    outputs = _rows(5000, 2)
    outputs[0, 0] = np.nan  # non-finite outputs: null in list encoding, bits in base64
    assert helper.run("encode", outputs, encoding) == encode_reply(outputs, encoding)


def test_a_killed_helper_costs_no_job_and_is_replaced(helper: Any) -> None:
    body = orjson.dumps({"inputs": _rows(100).tolist()})
    helper.run("parse", body, ("x",))
    first = helper.pid
    os.kill(first, signal.SIGKILL)
    given, _ = helper.run("parse", body, ("x",))  # answered in this process, once
    np.testing.assert_array_equal(given["x"].array, _rows(100).astype(np.float64))
    helper.run("parse", body, ("x",))
    assert helper.pid not in (None, first)


def test_a_helper_that_cannot_start_is_given_up_after_a_few_tries(helper: Any,
                                                                  monkeypatch: Any) -> None:
    from qkan_pack.serve import _offload

    starts = []
    real = subprocess.Popen

    def counted(*args: Any, **kwargs: Any) -> Any:
        starts.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(_offload, "HELPER_MAIN", "raise SystemExit(3)")
    monkeypatch.setattr(_offload.subprocess, "Popen", counted)
    body = orjson.dumps({"inputs": _rows(10).tolist()})
    for _ in range(_offload.MAX_FAILURES + 3):
        given, _ = helper.run("parse", body, ("x",))
        assert given["x"].array.shape == (10, 2)
    assert len(starts) == _offload.MAX_FAILURES


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # exited, not yet reaped by whoever adopted it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_helper_exits_with_its_replica(tmp_path: Path) -> None:
    """A replica killed with SIGKILL cannot stop its helper; the helper sees its socket
    close and exits on its own."""
    script = tmp_path / "replica.py"
    script.write_text(
        "import os, signal\n"
        "from qkan_pack.serve._offload import WireHelper\n"
        "helper = WireHelper()\n"
        "helper.run('parse', b'{\"inputs\": [[0.5, 0.25]]}', ('x',))\n"
        "print(helper.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == -signal.SIGKILL, run.stderr
    pid = int(run.stdout.split()[0])
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid)


def test_a_stuck_helper_holds_no_job(helper: Any, monkeypatch: Any) -> None:
    """Audit: a helper that stopped answering (here SIGSTOP) held every large request, and
    the lock, forever; now it is given up after the job's time limit and the job is done
    in the replica."""
    from qkan_pack.serve import _offload

    body = orjson.dumps({"inputs": _rows(50).tolist()})
    helper.run("parse", body, ("x",))
    stuck = helper.pid
    monkeypatch.setattr(_offload, "job_timeout_s", lambda size: 0.5)
    os.kill(stuck, signal.SIGSTOP)
    try:
        given, _ = helper.run("parse", body, ("x",))
    finally:
        if not _gone(stuck):
            os.kill(stuck, signal.SIGKILL)
    assert given["x"].array.shape == (50, 2)
    # the next job starts a new helper: give it a start-up's time on a loaded host
    monkeypatch.setattr(_offload, "job_timeout_s", lambda size: 60.0)
    helper.run("parse", body, ("x",))
    assert helper.pid not in (None, stuck)
