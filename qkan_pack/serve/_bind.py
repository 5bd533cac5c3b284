"""Whether ``serve`` can listen where it is told, checked before Ray starts
(``check_port_free``): a taken port, an address that is not this machine's, and, for Ray's
Python proxy, a port still held by the connections of a server that stopped there.

Why the last: Linux keeps a closed connection's port in TIME_WAIT for a minute. HAProxy and
gRPC servers bind with ``SO_REUSEADDR``, which TIME_WAIT does not stop; Ray's Python proxy
binds without it (``SO_REUSEADDR`` comes with its ``SO_REUSEPORT``, which ``serve`` turns
off: one server per port), so right after another server on the same port it cannot listen,
and the start failed deep inside Ray ("Failed to bind to address"). The check binds as that
listener will, waits out the TIME_WAIT (saying so), and refuses clearly if it outlasts it.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable

from ..errors import ServeError

#: How long Linux keeps a closed connection's port in TIME_WAIT (fixed in the kernel).
TIME_WAIT_S = 60.0
#: How often the wait for TIME_WAIT to clear binds again.
REBIND_S = 0.5


def check_port_free(host: str, port: int, *, plain: bool = False, wait_s: float = TIME_WAIT_S,
                    notice: Callable[[str], None] = lambda line: None) -> None:
    """Bind as a listener would (without ``SO_REUSEPORT``, so it fails even against a
    listener that set it; on Linux ``SO_REUSEADDR`` still fails against any listener): a
    second server on a taken port must fail here, never share the port. ``plain``: the
    listener binds without ``SO_REUSEADDR`` too (Ray's Python proxy): wait up to ``wait_s``
    for connections lingering in TIME_WAIT, then refuse."""
    _bind(host, port, reuse_address=True)  # TIME_WAIT is no owner
    if not plain:
        return
    deadline, told = time.monotonic() + wait_s, False
    while not _binds_plain(host, port):
        if time.monotonic() >= deadline:
            raise ServeError(f"port {port} on {host} is still held by connections of a server "
                             "that stopped there (TIME_WAIT, up to a minute): Ray's Python "
                             "proxy cannot listen on it until they close",
                             hint="start again in a minute, use --ingress haproxy (which can), "
                             "or choose another --port")
        if not told:
            notice(f"port {port}: waiting up to {wait_s:g} s for the connections of a server "
                   "that stopped there to close (TIME_WAIT): Ray's Python proxy cannot "
                   "listen until then")
            told = True
        time.sleep(REBIND_S)


def _binds_plain(host: str, port: int) -> bool:
    """Whether a bind without ``SO_REUSEADDR`` succeeds (a port of this machine's, free but
    for TIME_WAIT at most: ``_bind`` with it succeeded)."""
    try:
        _bind(host, port, reuse_address=False)
    except ServeError:
        return False
    return True


def _bind(host: str, port: int, *, reuse_address: bool) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        if reuse_address:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except socket.gaierror as exc:
            raise ServeError(f"--host {host}: not an address of this machine ({exc.strerror})",
                             hint="use 127.0.0.1, 0.0.0.0 or an address of this host") from None
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise ServeError(f"cannot listen on {host}:{port} ({exc.strerror})",
                                 hint="check --host (an address of this machine) and --port"
                                 ) from None
            raise ServeError(f"port {port} on {host} is already in use ({exc.strerror})",
                             hint="stop the server there or choose another --port") from None
