"""HAProxy's admin socket: commands to a running HAProxy (a repository's routes changed
without a reload) and the requests it answered itself, as ``GET /metrics`` counts them.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ._haproxy import COUNTS_TABLE_NAME, is_app_backend
from ._haproxy_replies import GRPC_UNAVAILABLE_SECTION, UNAVAILABLE_SECTION

#: HAProxy's own listeners for requests no replica can take, by the protocol they answer.
_UNAVAILABLE_LISTENERS = {UNAVAILABLE_SECTION.split()[1]: "http",
                          GRPC_UNAVAILABLE_SECTION.split()[1]: "grpc"}


async def ingress_counts(socket_path: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The requests HAProxy answered itself (``parse_ingress_counts``), read from its admin
    socket; None where there is no HAProxy on this node or it does not answer in time."""
    import asyncio

    if not os.path.exists(socket_path):
        return None
    try:
        stat = await asyncio.wait_for(admin_command(socket_path, "show stat"), timeout_s)
        table = await asyncio.wait_for(
            admin_command(socket_path, f"show table {COUNTS_TABLE_NAME}"), timeout_s)
    except (OSError, asyncio.TimeoutError):
        return None
    return parse_ingress_counts(stat, table)


async def admin_command(socket_path: str, command: str) -> str:
    """``command``'s answer from HAProxy's admin socket at ``socket_path``."""
    import asyncio

    reader, writer = await asyncio.open_unix_connection(socket_path)
    try:
        writer.write(command.encode() + b"\n")
        await writer.drain()
        return (await reader.read(-1)).decode("utf-8", "replace")
    finally:
        writer.close()


def parse_ingress_counts(stat_csv: str, table: str) -> dict[str, Any]:
    """From ``show stat`` and ``show table``: 401s of the HTTP frontend (``COUNTS_TABLE``),
    overload refusals (denied requests) of each app backend by protocol (``http``, ``grpc``),
    and requests that no replica could take, by protocol (the listeners of
    ``_haproxy_replies``: HTTP's JSON 503, gRPC's UNAVAILABLE)."""
    import csv

    counts: dict[str, Any] = {"unauthorized": 0, "overloaded": {}, "unavailable": {}}
    found = re.search(r"\bgpc0=(\d+)", table)
    if found:
        counts["unauthorized"] = int(found[1])
    lines = stat_csv.lstrip("# ").splitlines()
    for row in csv.DictReader(lines):
        name, kind = row.get("pxname", ""), row.get("svname", "")
        if kind == "BACKEND" and is_app_backend(f"backend {name}"):
            protocol = "grpc" if name.startswith("grpc") else "http"
            counts["overloaded"][protocol] = (counts["overloaded"].get(protocol, 0)
                                              + int(row.get("dreq") or 0))
        elif kind == "FRONTEND" and name in _UNAVAILABLE_LISTENERS:
            counts["unavailable"][_UNAVAILABLE_LISTENERS[name]] = int(row.get("req_tot") or 0)
    return counts
