"""``qkan-pack serve`` in a session of its own, so that a signal to its process group stops
it in order.

Ray starts its own processes (control store, raylet, agents) as children of the process that
calls ``ray.init``, in that process's group. Ray makes them ignore SIGINT, so a terminal's
Ctrl-C (SIGINT to the whole foreground group) reaches only the serve, which drains and stops
Ray itself. SIGTERM to the whole group does not: ``kill -TERM -PGID``, GNU ``timeout`` and
process managers that stop a group kill Ray's control store and raylet at once. The serve
then waited ~60 s for the control store, exited 1 without its cleanup and left HAProxy
holding the port (measured on the CPU: exit 1 after 60.6 s).

So the command runs as two processes. The one started (the supervisor) only starts the real
serve as a child in a new session, passes SIGINT on as SIGINT and SIGTERM or SIGHUP as
SIGTERM, and exits with the child's exit status. A signal to the supervisor's group reaches
the supervisor alone; Ray's processes live in the child's session and are stopped by the
child, in order. The child gets SIGTERM if the supervisor dies (``PR_SET_PDEATHSIG``, Linux),
so killing the supervisor still stops the server, with its drain.

What this does not cover: a process manager that signals every process of a cgroup
(systemd's default ``KillMode=control-group``) reaches Ray's processes anyway; use
``KillMode=mixed`` (SIGTERM to the main process, the supervisor, only).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from types import FrameType

#: Set (to the supervisor's process id) in the child's environment: run the command here.
CHILD_ENV = "QKAN_PACK_SERVE_SUPERVISOR"
#: What the supervisor passes on to the child, per signal it receives.
FORWARDED = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM,
             signal.SIGHUP: signal.SIGTERM}
_PR_SET_PDEATHSIG = 1


def run_in_own_session(args: Sequence[str]) -> int | None:
    """Run ``qkan-pack ARGS`` (a ``serve`` command line) as a child in a new session and
    return its exit status; None when this process is that child (run the command here)."""
    parent = os.environ.pop(CHILD_ENV, None)
    if parent is not None:
        if parent != str(os.getppid()):  # the supervisor died before the death signal was set
            raise SystemExit(128 + signal.SIGTERM)
        return None
    child = subprocess.Popen([sys.executable, "-m", "qkan_pack", *args],
                             env={**os.environ, CHILD_ENV: str(os.getpid())},
                             start_new_session=True, preexec_fn=_death_signal_setter())
    saved = {sig: signal.signal(sig, _forwarder(child)) for sig in FORWARDED}
    try:
        status = child.wait()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return status if status >= 0 else 128 - status


def _forwarder(child: subprocess.Popen[bytes]) -> Callable[[int, FrameType | None], None]:
    def forward(sig: int, frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(FORWARDED[signal.Signals(sig)])

    return forward


def _death_signal_setter() -> Callable[[], None] | None:
    """For the forked child, before it runs the command: SIGTERM when its parent exits (libc
    looked up here, before the fork). None where there is no ``prctl`` (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))

    return set_death_signal
