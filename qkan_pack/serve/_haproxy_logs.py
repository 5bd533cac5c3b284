"""HAProxy's per-request log targets, as the ingress wrapper (``_haproxy``) keeps them.

Ray's template logs every request twice: an access-log line to
``RAY_SERVE_HAPROXY_LOG_TARGET`` (UDP syslog on 127.0.0.1:514 by default, where nothing
listens unless the host runs a syslog daemon) and a line to a unix socket that Ray's
HAProxyManager actor parses into Ray's own request metrics (``serve_num_http_requests`` and
kin, on Ray's loopback exporter). qkan-pack's ``GET /metrics`` counts requests itself, so
both cost CPU for nothing: 36 µs of HAProxy's and 54 µs of Ray's processes' per request
on the 2-core CPU host, where one replica answered 1.16x the requests per second without
them (``benchmarks/results/2026-12-07_cpu_haproxy-request-logs.txt``).
Each is dropped unless serve's environment asks for it: ``RAY_SERVE_HAPROXY_LOG_TARGET``
set keeps the access log (``benchmarks/haproxy_log.py`` reads it), and
``RAY_SERVE_HAPROXY_METRICS_ENABLED=1`` (or Ray's request-router metrics turned on) Ray's
request metrics.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

#: What keeps each of HAProxy's per-request log targets (see the module docstring): the
#: access log, and the metrics socket Ray's HAProxyManager reads (its lines are RFC 5424).
REQUEST_LOG_ENV = {"access": ("RAY_SERVE_HAPROXY_LOG_TARGET",),
                   "metrics": ("RAY_SERVE_HAPROXY_METRICS_ENABLED",
                               "RAY_SERVE_INGRESS_REQUEST_ROUTER_METRICS_ENABLED")}
_LOG_TARGET = re.compile(r"\s*log\s+(?!global\s*$)\S.*")


def kept_request_logs(env: Mapping[str, str]) -> frozenset[str]:
    """The per-request log targets (``REQUEST_LOG_ENV``'s keys) serve's environment asks
    for: the access log if its target is set at all, Ray's metrics (request counts, or its
    request router's, which share the socket) if either is turned on by name."""
    kept = {"access"} if any(env.get(name) for name in REQUEST_LOG_ENV["access"]) else set()
    if any(env.get(name, "").strip().lower() in ("1", "true", "yes", "on")
           for name in REQUEST_LOG_ENV["metrics"]):
        kept.add("metrics")
    return frozenset(kept)


def without_request_logs(config: str, kept: Collection[str]) -> str:
    """``config`` without the log targets not in ``kept`` (``log global`` lines stay: with
    no target left they log nothing)."""
    return "\n".join(line for line in config.split("\n")
                     if not _LOG_TARGET.fullmatch(line)
                     or ("metrics" if "rfc5424" in line else "access") in kept)
