"""gRPC calls that HAProxy passes on to the replicas' HTTP servers (``_grpc_http``): the
rewrite of Ray's generated gRPC backend that does it, and when it applies. Part of the
HAProxy wrapper's rewrite (``_haproxy.main``), in a module of its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ._ray_compat import GRPC_APPLICATION_ENV
from ._uvicorn_compat import replies_whole_here


def grpc_over_http_here() -> bool:
    """Whether gRPC calls go to the replicas' HTTP servers (``grpc_to_http_servers``): one
    artifact's serve (a model repository's calls go to its router, which the environment
    of its Ray processes names: ``GRPC_APPLICATION_ENV``), whose replicas' uvicorn can
    write trailers (``_uvicorn_compat``)."""
    return GRPC_APPLICATION_ENV not in os.environ and replies_whole_here()


#: The health check of a gRPC backend whose servers are the replicas' HTTP servers: the
#: HTTP backends' own (Ray's template), in place of its HTTP/2 ``tcp-check`` lines.
_HTTP_CHECK = ("    option httpchk GET /-/healthz", "    http-check expect status 200")


def grpc_to_http_servers(config: str) -> str:
    """Each app's gRPC backend (``grpc-<app>``) with its replicas' HTTP servers (those of
    ``http-<app>``, by server name) in place of their gRPC servers, spoken to in HTTP/1.1
    (no ``proto h2``) and checked as the HTTP backend checks them: HAProxy then passes each
    gRPC call on as an HTTP request, which the replica answers on uvicorn's HTTP path
    (``_grpc_http``), far cheaper per call than grpc's asyncio server. A backend whose
    servers are not all found is left as Ray wrote it. (Not for a model repository: its
    calls reach a version through its router, which reads the model's name in the
    message.)"""
    lines = config.split("\n")
    http, grpc = server_addresses(lines, "http-"), server_addresses(lines, "grpc-")
    out, rewrite = [], False
    for line in lines:
        if line and not line[0].isspace():
            head = line.strip()
            app = head.removeprefix("backend grpc-") if head.startswith("backend grpc-") else None
            rewrite = app is not None and bool(grpc.get(app)) and grpc[app].keys() <= http.get(
                app, {}).keys()
            out.append(line)
            continue
        if rewrite:
            line_or_none = _grpc_line_over_http(line, http[app or ""])
            if line_or_none is None:
                continue
            out.extend(line_or_none)
            continue
        out.append(line)
    return "\n".join(out)


def _grpc_line_over_http(line: str, addresses: Mapping[str, str]) -> list[str] | None:
    """One line of a gRPC backend rewritten for its replicas' HTTP servers (None: dropped)."""
    stripped = line.strip()
    if stripped == "option tcp-check":
        return list(_HTTP_CHECK)
    if stripped.startswith("tcp-check "):
        return None
    server = re.match(r"(\s*server (\S+) )\S+( .*)?$", line)
    if server and not re.search(r"\sbackup(\s|$)", line):
        rest = re.sub(r"\s+proto h2\b", "", server[3] or "")
        return [f"{server[1]}{addresses[server[2]]}{rest}"]
    return [line]


def server_addresses(lines: list[str], prefix: str = "") -> dict[str, dict[str, str]]:
    """Per backend named ``<prefix><name>``, its replica servers' addresses (not its
    backups) by server name, keyed by ``<name>``."""
    found: dict[str, dict[str, str]] = {}
    app = None
    for line in lines:
        if line and not line[0].isspace():
            head = line.strip()
            app = head.removeprefix(f"backend {prefix}") if head.startswith(
                f"backend {prefix}") else None
            continue
        server = re.match(r"\s*server (\S+) (\S+)", line)
        if app is not None and server and not re.search(r"\sbackup(\s|$)", line):
            found.setdefault(app, {})[server[1]] = server[2]
    return found
