"""A ``qkan-pack serve`` process for the tests, started as a user starts it, with a tag in
its environment so that every process it leaves behind can be found."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TAG_ENV = "QKAN_PACK_TEST_SERVE_TAG"


def free_port() -> int:
    """A port to serve on, drawn as the server draws its side ports (``side_ports``: below
    the kernel's ephemeral range, which Ray's processes bind while the server starts; an
    ephemeral port from ``bind(0)`` was taken that way before haproxy listened on it)."""
    from qkan_pack.serve._launch import side_ports

    return side_ports(1, exclude=set())[0]


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment carries ``tag`` (the server and all it started)."""
    marker = f"{TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and marker in (entry / "environ").read_bytes()
                    and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@dataclass
class Server:
    artifact: Path
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    token: str | None = None
    port: int = field(default_factory=free_port)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    cwd: Path | None = None  # where the command runs (a relative artifact path is from here)

    def start(self, timeout_s: float = 240.0) -> Server:
        env = {**os.environ, **self.env, TAG_ENV: self.tag}
        command = [sys.executable, "-m", "qkan_pack", "serve", str(self.artifact),
                   "--port", str(self.port), *self.args]
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True,
                                        cwd=self.cwd)
        self.stdout: list[str] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line:
                self.stdout.append(line)
            if line.startswith("serving "):
                return self
            if not line and self.process.poll() is not None:
                break
        self.kill()
        raise AssertionError(f"serve did not start: {self.stdout} {self.process.stderr.read()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, path: str = "/", body: bytes | None = None, *, method: str | None = None,
                token: str | bool | None = True, timeout: float = 30
                ) -> tuple[int, dict[str, str], bytes]:
        headers = {"Content-Type": "application/json"}
        use = self.token if token is True else token
        if use:
            headers["Authorization"] = f"Bearer {use}"
        request = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return reply.status, dict(reply.headers), reply.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def json(self, path: str = "/", payload: Any = None, **kw: Any) -> tuple[int, Any]:
        body = None if payload is None else json.dumps(payload).encode()
        status, _, raw = self.request(path, body, **kw)
        return status, strict_json(raw)

    def replica_pids(self) -> list[int]:
        found = []
        for pid in tagged_pids(self.tag):
            with contextlib.suppress(OSError):
                if b"ServeReplica" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
        return found

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 90.0) -> tuple[int, str]:
        self.process.send_signal(sig)
        try:
            _, err = self.process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return self.process.returncode, err

    def kill(self) -> None:
        for pid in tagged_pids(self.tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def grpc_server(target: Path, args: list[str], directory: Path, token: str, *,
                env: dict[str, str] | None = None, timeout_s: float = 240.0) -> Iterator[Server]:
    """``qkan-pack serve target`` behind ``token`` (a token file of mode 0600 in ``directory``)
    with a gRPC port (``.grpc_port``), stopped and every process it started killed at the
    end: the servers of the protocol, metrics and repository tests."""
    token_file = directory / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)  # a token file others may write is refused
    grpc_port = free_port()
    running = Server(target, ["--auth-token-file", str(token_file), *args, "--grpc-port",
                              str(grpc_port)], env=env or {}, token=token).start(timeout_s)
    running.grpc_port = grpc_port
    try:
        yield running
    finally:
        running.stop()
        running.kill()


def listeners(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket ``pids`` listen on, from ``/proc`` (what
    ``ss -ltnp`` shows, without needing it installed)."""
    listening: dict[str, tuple[str, int]] = {}
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                fields = row.split()
                if fields[3] == "0A":  # LISTEN
                    address, port = fields[1].split(":")
                    listening[fields[9]] = (_address(address), int(port, 16))
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    inode = target.removeprefix("socket:[").removesuffix("]")
                    if target.startswith("socket:[") and inode in listening:
                        found.append((pid, *listening[inode]))
    return sorted(set(found))


def _address(hex_text: str) -> str:
    """/proc/net/tcp's address (32-bit words in host byte order) as text."""
    raw = bytes.fromhex(hex_text)
    return str(ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))))


def is_loopback(address: str) -> bool:
    """127.0.0.0/8 and ::1, IPv4-mapped included (``::ffff:127.0.0.1``)."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def command_line(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


def strict_json(raw: bytes) -> Any:
    """What a strict parser (JavaScript, Go, serde) accepts: no NaN/Infinity literals."""
    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(raw, parse_constant=refuse)
