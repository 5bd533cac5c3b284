"""Whether ``serve`` can listen where it is told, checked before Ray starts
(``check_port_free``): a taken port, an address that is not this machine's, and a port still
held by the connections of a server that stopped there a moment ago.

Why the last: Linux keeps a closed connection's port in TIME_WAIT for a minute (and a
connection the server closed first in FIN_WAIT until its client closes too, or a minute).
A bind with ``SO_REUSEADDR`` passes such a port only where the server that held it had set
it too; a bind without it (Ray's Python proxy: ``SO_REUSEADDR`` comes with its
``SO_REUSEPORT``, which ``serve`` turns off, one server per port) never does. So right
after another server on the same port the start failed, with "already in use" where no
server was, or deep inside Ray ("Failed to bind to address"). The check binds as the
listener will; where it cannot and no socket listens on the port (``/proc/net/tcp``), it
waits for the connections to close, saying so, and refuses with that reason if they outlast
``TIME_WAIT_S``.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import ServeError

#: How long Linux keeps a closed connection's port in TIME_WAIT (fixed in the kernel).
TIME_WAIT_S = 60.0
#: How often the wait for the connections to close binds again.
REBIND_S = 0.5
#: ``/proc/net/tcp``'s state of a listening socket.
LISTEN_STATE = "0A"


class _InUse(Exception):
    """A bind refused with EADDRINUSE."""


def check_port_free(host: str, port: int, *, plain: bool = False, wait_s: float = TIME_WAIT_S,
                    notice: Callable[[str], None] = lambda line: None) -> None:
    """Bind as the listener will (never with ``SO_REUSEPORT``, so it fails even against a
    listener that set it; ``plain``: without ``SO_REUSEADDR`` either, as Ray's Python proxy
    binds): a second server on a taken port fails here, never shares the port. A port held
    only by closing connections is waited for, up to ``wait_s``."""
    deadline, told = time.monotonic() + wait_s, False
    while True:
        try:
            _bind(host, port, reuse_address=True)
            if plain:
                _bind(host, port, reuse_address=False)
            return
        except _InUse as exc:
            if _listened(port) is not False:  # a server listens there (or /proc cannot say)
                raise ServeError(f"port {port} on {host} is already in use ({exc})",
                                 hint="stop the server there or choose another --port") from None
        if time.monotonic() >= deadline:
            raise ServeError(f"port {port} on {host} is still held by connections of a server "
                             "that stopped there (TIME_WAIT, up to a minute): a new listener "
                             "cannot bind it until they close",
                             hint="start again in a minute, or choose another --port")
        if not told:
            notice(f"port {port}: waiting up to {wait_s:g} s for the connections of a server "
                   "that stopped there to close (TIME_WAIT) before listening on it")
            told = True
        time.sleep(REBIND_S)


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
            if exc.errno == errno.EADDRINUSE:
                raise _InUse(exc.strerror) from None
            raise ServeError(f"cannot listen on {host}:{port} ({exc.strerror})",
                             hint="check --host (an address of this machine) and --port") from None


def _listened(port: int) -> bool | None:
    """Whether a TCP socket of this host listens on ``port`` (False: the sockets on it are
    connections only; None: ``/proc/net/tcp`` cannot say)."""
    states = set()
    try:
        for table in ("tcp", "tcp6"):
            for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                fields = row.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    states.add(fields[3])
    except (OSError, IndexError, ValueError):
        return None
    return LISTEN_STATE in states if states else None
