"""The serve's bearer token without Ray: which tokens and token files are accepted (each
refusal a one-line usage error naming the fix), the gate in front of Ray's own HTTP servers,
and ``serve --key`` refusing an artifact whose signature does not verify before Ray starts
or any artifact code runs (issue 32, items 9 and the missing ``--key``)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from qkan_pack.cli import cli
from qkan_pack.errors import ServeTokenError
from qkan_pack.serve import check_token, read_token_file, token_digest
from qkan_pack.serve._auth import (
    GATE_CALLBACK,
    LIVENESS_PATH,
    RAY_CALLBACK_ENV,
    TOKEN_DIGEST_ENV,
    UNAUTHORIZED_BODY,
    TokenGate,
    gate_env,
    gate_middlewares,
)

from ..conftest import MODELS

TOKEN = "gate-token-0123456789abcdef"


def _token_file(tmp_path: Path, content: bytes, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_bytes(content)
    path.chmod(mode)
    return path


def _serve(*args: object, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli, ["serve", *map(str, args)], env=env)


@pytest.fixture
def taken_port() -> Any:
    """A port in use: a start that gets past every check stops there, before Ray."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_a_token_file_with_a_byte_order_mark_is_read_as_utf8(tmp_path: Path) -> None:
    """Audit: a token file saved with a UTF-8 BOM passed every check, and the server died
    ~16 s later with "unexpected UnicodeEncodeError" (the BOM became part of the token)."""
    path = _token_file(tmp_path, b"\xef\xbb\xbf" + TOKEN.encode() + b"\r\n# rotated\n")
    assert read_token_file(path) == TOKEN


@pytest.mark.parametrize(("content", "says"), [
    ("gate-token-01234567\u00e9".encode(), "non-ASCII character (\\xe9 at position 20)"),
    ("\u00e9t\u00e9-token-0123456789".encode("latin-1"), "is not UTF-8 text"),
    (TOKEN.encode("utf-16"), "is not UTF-8 text"),
    (b"short-token\n", "shorter than 16 characters"),
    (b"gate-token\x07-0123456789\n", "control character (\\x07 at position 11)"),
    (b"\n\n", "holds no token"),
    (b"x" * 2000, "longer than 1024 characters"),
])
def test_token_files_serve_cannot_use_are_refused_saying_why(tmp_path: Path, content: bytes,
                                                              says: str) -> None:
    """Audit: a non-ASCII token only admitted latin-1 clients (curl sends UTF-8: 401)."""
    with pytest.raises(ServeTokenError) as info:
        read_token_file(_token_file(tmp_path, content))
    assert says in info.value.problem and info.value.source.startswith("token file ")


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_token_file_others_can_write_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    """Audit: a world-writable token file was accepted silently (whoever can write it
    chooses the token)."""
    path = _token_file(tmp_path, TOKEN.encode(), mode)
    with pytest.raises(ServeTokenError, match=f"writable by its group or others .*chmod 600 {path}"):
        read_token_file(path)
    for fine in (0o600, 0o640, 0o644, 0o400):
        path.chmod(fine)
        assert read_token_file(path) == TOKEN


def test_a_token_file_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "token"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ServeTokenError, match="is not a regular file"):
        read_token_file(fifo)


@pytest.mark.parametrize("link", [False, True])
def test_a_token_file_that_is_a_device_is_refused_unread(tmp_path: Path, link: bool) -> None:
    """/dev/zero (or a link to it: token files may be links, as mounted secrets are) is
    refused on its descriptor before a byte is read."""
    path = Path("/dev/zero")
    if link:
        path = tmp_path / "token"
        path.symlink_to("/dev/zero")
    with pytest.raises(ServeTokenError, match="is not a regular file"):
        read_token_file(path)


def test_a_token_given_to_the_library_follows_the_same_rules() -> None:
    assert check_token(TOKEN, "x") == TOKEN
    with pytest.raises(ServeTokenError, match="the token argument holds a non-ASCII"):
        from qkan_pack.serve import serve_forever

        serve_forever("/nonexistent", token="caf\u00e9-token-0123456789")


@pytest.mark.parametrize(("content", "says"), [
    ("gate-token-01234567\u00e9\n".encode(), "non-ASCII character"),
    (b"short\n", "shorter than 16"),
])
def test_serve_refuses_a_bad_token_file_as_a_usage_error(mlp_artifact: Path, tmp_path: Path,
                                                         content: bytes, says: str) -> None:
    result = _serve(mlp_artifact, "--auth-token-file", _token_file(tmp_path, content))
    assert result.exit_code == 2 and says in result.output, result.output
    assert "Invalid value for --auth-token-file" in result.output
    assert "unexpected" not in result.output and "Traceback" not in result.output


def test_serve_refuses_a_writable_token_file_as_a_usage_error(mlp_artifact: Path,
                                                              tmp_path: Path) -> None:
    path = _token_file(tmp_path, TOKEN.encode(), 0o666)
    result = _serve(mlp_artifact, "--auth-token-file", path)
    assert result.exit_code == 2 and f"chmod 600 {path}" in result.output, result.output


def test_serve_refuses_a_non_ascii_token_in_the_environment(mlp_artifact: Path) -> None:
    result = _serve(mlp_artifact, env={"QKAN_PACK_SERVE_TOKEN": "caf\u00e9-token-0123456789"})
    assert result.exit_code == 2 and "QKAN_PACK_SERVE_TOKEN" in result.output, result.output
    assert "non-ASCII" in result.output


def test_serve_takes_the_token_out_of_its_environment(mlp_artifact: Path, taken_port: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit: a token in QKAN_PACK_SERVE_TOKEN stayed in the environment of 12 of the 14
    processes a serve runs (Ray's, the replicas running model code). The serve takes it out
    of its own environment before it starts anything."""
    monkeypatch.setenv("QKAN_PACK_SERVE_TOKEN", TOKEN)
    result = _serve(mlp_artifact, "--port", taken_port)
    assert result.exit_code == 1 and "already in use" in result.output, result.output
    assert "QKAN_PACK_SERVE_TOKEN" not in os.environ


# ---------------------------------------------------------------------------
# The gate in front of Ray's HTTP servers
# ---------------------------------------------------------------------------


def _call(gate: TokenGate, path: str, authorization: bytes | None = None,
          kind: str = "http") -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    headers = [(b"host", b"x")] + ([(b"Authorization", authorization)] if authorization else [])
    scope = {"type": kind, "path": path, "root_path": "", "headers": headers}
    asyncio.run(gate(scope, receive, send))
    return sent


async def _ray_like(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """What Ray's proxy or a replica's direct ingress answers on its own routes."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.accept"})
        return
    body = b"success" if scope["path"] == LIVENESS_PATH else b'{"/": "qkan-pack"}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"x-request-id", b"abc")]})
    await send({"type": "http.response.body", "body": body[:3], "more_body": True})
    await send({"type": "http.response.body", "body": body[3:]})


def test_the_gate_needs_the_token_on_every_route_but_the_bare_liveness_route() -> None:
    """Audit: Ray answered ``/-/healthz`` and ``/-/routes`` (app name, route prefix) on the
    replicas' direct-ingress ports and its proxies without the token, before any app code."""
    gate = TokenGate(_ray_like, token_sha256=token_digest(TOKEN))
    for path in ("/-/routes", "/", "/stats", "/-/HEALTHZ", "/-/healthz/x"):
        for sent in (None, b"Bearer wrong-token-0123456789", TOKEN.encode(),
                     b"Basic " + TOKEN.encode(), b"Bearer " + TOKEN.encode() + b"x"):
            start, body = _call(gate, path, sent)
            assert start["status"] == 401 and body["body"] == UNAUTHORIZED_BODY, (path, sent)
            assert (b"www-authenticate", b'Bearer realm="qkan-pack"') in start["headers"]
        for sent in (b"Bearer " + TOKEN.encode(), b"bearer  " + TOKEN.encode() + b" "):
            replies = _call(gate, path, sent)
            assert replies[0]["status"] == 200 and len(replies) == 3, (path, sent)
    for sent in (None, b"Bearer wrong-token-0123456789", b"Bearer " + TOKEN.encode()):
        assert _call(gate, LIVENESS_PATH, sent) == [
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]},
            {"type": "http.response.body", "body": b""}]
    assert _call(gate, "/", None, kind="websocket") == [{"type": "websocket.close", "code": 1008}]
    assert _call(gate, "/", b"Bearer " + TOKEN.encode(), kind="websocket")[0]["type"] == (
        "websocket.accept")


def test_ray_gets_the_gate_and_only_the_tokens_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray Serve calls ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` in each proxy and replica
    for the middlewares of the HTTP servers it starts; the digest comes through the
    environment, the token never."""
    from ray._common.utils import import_attr
    from ray.serve._private.http_util import validate_http_proxy_callback_return

    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    env = gate_env(digest)
    assert env == {RAY_CALLBACK_ENV: GATE_CALLBACK, TOKEN_DIGEST_ENV: digest} and gate_env(None) == {}
    assert import_attr(GATE_CALLBACK) is gate_middlewares
    monkeypatch.setenv(TOKEN_DIGEST_ENV, digest)
    (middleware,) = validate_http_proxy_callback_return(gate_middlewares())
    assert middleware.cls is TokenGate and middleware.kwargs == {"token_sha256": digest}
    monkeypatch.delenv(TOKEN_DIGEST_ENV)
    assert gate_middlewares() == []


# ---------------------------------------------------------------------------
# serve --key
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def signing_keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("model_signing", reason="needs the [sign] extra")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder = tmp_path_factory.mktemp("keys")
    for name in ("a", "b"):
        key = ec.generate_private_key(ec.SECP256R1())
        (folder / f"{name}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        (folder / f"{name}.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return folder


@pytest.fixture(scope="module")
def sentinel_artifact(tmp_path_factory: pytest.TempPathFactory, signing_keys: Path) -> Path:
    """tests/models/sentinel_model.py (its code leaves a trace when it runs), signed with a."""
    from qkan_pack import build
    from qkan_pack.builder import sign

    saved = os.environ.pop("QKAN_PACK_SENTINEL", None)
    try:
        out = build(MODELS / "sentinel_model.py", "1x2", output=tmp_path_factory.mktemp("s") / "a")
    finally:
        if saved is not None:
            os.environ["QKAN_PACK_SENTINEL"] = saved
    sign(out.path, signing_keys / "a.key")
    return out.path


@pytest.fixture
def sentinel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "sentinel.log"
    monkeypatch.setenv("QKAN_PACK_SENTINEL", str(path))
    for name in [n for n in sys.modules if n.startswith("qkan_pack_model_")]:
        monkeypatch.delitem(sys.modules, name)
    return path


def test_serve_key_refuses_a_signature_by_another_key_before_ray_starts(
        sentinel_artifact: Path, signing_keys: Path, sentinel: Path, taken_port: int) -> None:
    """Audit: ``serve`` had no ``--key``, so it could not require a signature at all. A
    signature that does not verify now fails the command with the signature error's one
    line, before anything starts (the taken port is never reached) or any artifact code runs."""
    result = _serve(sentinel_artifact, "--key", signing_keys / "b.pub", "--port", taken_port)
    assert result.exit_code == 1, result.output
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith("Error: artifact ") and "refusing it" in line, line
    assert "already in use" not in result.output and not sentinel.exists()
    result = _serve(sentinel_artifact, "--key", signing_keys / "b.pub", "--key",
                    signing_keys / "a.pub", "--port", taken_port)
    assert result.exit_code == 1 and "already in use" in result.output, result.output
    assert not sentinel.exists()


def test_replicas_refuse_an_artifact_whose_signature_does_not_verify(
        sentinel_artifact: Path, signing_keys: Path, sentinel: Path) -> None:
    """What ``serve --key`` gives each replica: ``Predictor.load``'s ``trusted_keys``, checked
    before any of the artifact's code runs."""
    from qkan_pack.errors import ArtifactSignatureError
    from qkan_pack.serve import ArtifactServer, ServeOptions

    with pytest.raises(ArtifactSignatureError) as info:
        ArtifactServer(str(sentinel_artifact), options=ServeOptions(device="cpu"),
                       predictor_options={"trusted_keys": [str(signing_keys / "b.pub")]})
    assert info.value.problem == "untrusted" and not sentinel.exists()
    server = ArtifactServer(str(sentinel_artifact), options=ServeOptions(device="cpu"),
                            predictor_options={"trusted_keys": [str(signing_keys / "a.pub")]})
    assert server.predictor.signed_by and sentinel.exists()


def test_serve_forever_hands_the_keys_to_every_replica(sentinel_artifact: Path,
                                                       signing_keys: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The deployment serve_forever builds carries the trusted keys to the replicas'
    constructor (Ray itself is stopped at the session, before it starts)."""
    from qkan_pack.serve import _launch

    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def app_for(artifact: Any, options: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise Stop

    class Session:
        def __init__(self, *args: Any, **keywords: Any) -> None:
            pass

        def resources(self) -> dict[str, float]:
            return {"CPU": 2.0}

        def close(self) -> None:
            pass

    monkeypatch.setattr(_launch, "app_for", app_for)
    monkeypatch.setattr(_launch, "_RaySession", Session)
    notes: list[str] = []
    with pytest.raises(Stop):
        _launch.serve_forever(sentinel_artifact, listen=_launch.Listen(port=_free_port()),
                              replica=_launch.ReplicaLoad(trusted_keys=[signing_keys / "a.pub"]),
                              notice=notes.append)
    assert seen["predictor_options"] == {"trusted_keys": [str(signing_keys / "a.pub")]}
    assert any(n.startswith("signature verified: signed by") for n in notes), notes


def _free_port() -> int:
    from ._server import free_port

    return free_port()
