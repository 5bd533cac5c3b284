"""``qkan-pack serve`` in a session of its own, so that a signal to its process group stops
it in order.

Ray starts its own processes (control store, raylet, agents) as children of the process that
calls ``ray.init``, in that process's group. Ray makes them ignore SIGINT, so a terminal's
Ctrl-C (SIGINT to the whole foreground group) reaches only the serve, which drains and stops
Ray itself. SIGTERM to the whole group does not: ``kill -TERM -PGID``, GNU ``timeout`` and
process managers that stop a group kill Ray's control store and raylet at once, and a serve
in that group then waits about a minute for the control store, exits 1 without its cleanup
and leaves HAProxy holding the port.

So the command runs as two processes. The one started (the supervisor) only starts the real
serve as a child in a new session, passes SIGINT on as SIGINT and SIGTERM or SIGHUP as
SIGTERM, and exits with the child's exit status. A signal to the supervisor's group reaches
the supervisor alone; Ray's processes live in the child's session and are stopped by the
child, in order. The child gets SIGTERM if the supervisor dies (``PR_SET_PDEATHSIG``, Linux),
so killing the supervisor still stops the server, with its drain.

Ctrl-\\ (SIGQUIT) is the force-quit: the supervisor kills the child's process group at once
(Ray's processes follow the child). A signal the supervisor was started ignoring (SIGHUP
under ``nohup``) stays ignored. The supervisor's handlers are installed before the child
starts; a signal that arrives before the child exists is passed on as soon as it does.

A token given in ``QKAN_PACK_SERVE_TOKEN`` is not passed on in the child's environment:
every process the serve starts (Ray's, and the replicas, which run the model's code) would
inherit it. The supervisor hands it to the child through a pipe instead; the serve then
passes only its sha256 on.

Standard library only, and outside the ``serve`` package (whose import pulls in numpy): the
supervisor stays a small process that forks nothing but the child.

What this does not cover: a process manager that signals every process of a cgroup
(systemd's default ``KillMode=control-group``) reaches Ray's processes anyway; use
``KillMode=mixed`` (SIGTERM to the main process, the supervisor, only). Ctrl-Z stops the
supervisor, not the server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from types import FrameType

#: Set (to the supervisor's process id) in the child's environment: run the command here.
CHILD_ENV = "QKAN_PACK_SERVE_SUPERVISOR"
#: The serve's bearer token, when not given in a file; and, in the child's environment, the
#: descriptor it can be read from instead.
TOKEN_ENV = "QKAN_PACK_SERVE_TOKEN"
TOKEN_FD_ENV = "QKAN_PACK_SERVE_TOKEN_FD"
#: At most this much of the token is handed over (a pipe holds it without blocking; the
#: serve refuses tokens far shorter).
HANDOVER_BYTES = 4096
#: What the supervisor does with each signal it receives: pass it on as this signal, or
#: (SIGKILL) kill the child's whole process group.
FORWARDED = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM,
             signal.SIGHUP: signal.SIGTERM, signal.SIGQUIT: signal.SIGKILL}
_PR_SET_PDEATHSIG = 1


def run_in_own_session(args: Sequence[str], command: Sequence[str] | None = None) -> int | None:
    """Run the ``serve`` command line ``args`` as a child in a new session and return its exit
    status; None when this process is that child (run the command here). ``command``: the
    child's full command line (default: ``python -m qkan_pack ARGS``; the CLI passes the way
    it was itself started, interpreter flags and entry point included)."""
    parent = os.environ.pop(CHILD_ENV, None)
    if parent is not None:
        _receive_token()
        _die_with_parent()
        if parent != str(os.getppid()):  # the supervisor died before the death signal was set
            raise SystemExit(128 + signal.SIGTERM)
        return None
    return _Supervisor().run(command or [sys.executable, "-m", "qkan_pack", *args])


_handed_over: list[str] = []


def handed_over_token() -> str | None:
    """The ``TOKEN_ENV`` value the supervisor handed to this child (None if it had none)."""
    return _handed_over[0] if _handed_over else None


def _receive_token() -> None:
    """Read the token the supervisor wrote into the pipe ``TOKEN_FD_ENV`` names."""
    fd_text = os.environ.pop(TOKEN_FD_ENV, None)
    if fd_text is None or not fd_text.isdigit():
        return
    fd = int(fd_text)
    chunks = []
    try:
        while chunk := os.read(fd, HANDOVER_BYTES + 1):
            chunks.append(chunk)
    finally:
        os.close(fd)
    _handed_over[:] = [os.fsdecode(b"".join(chunks))]


def _token_pipe(env: dict[str, str]) -> int | None:
    """Move ``TOKEN_ENV`` out of the child's environment ``env`` into a pipe; the read end
    (inherited by the child) is returned, and named in ``env``."""
    token = env.pop(TOKEN_ENV, None)
    if token is None:
        return None
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, os.fsencode(token)[:HANDOVER_BYTES])
    finally:
        os.close(write_end)
    env[TOKEN_FD_ENV] = str(read_end)
    return read_end


class _Supervisor:
    """Starts the child and passes signals on; a signal caught before the child exists is
    held and passed on once it does."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.pending: list[signal.Signals] = []

    def run(self, command: Sequence[str]) -> int:
        saved = {sig: signal.signal(sig, self._on_signal) for sig in FORWARDED
                 if signal.getsignal(sig) is not signal.SIG_IGN}
        env = {**os.environ, CHILD_ENV: str(os.getpid())}
        token_fd = _token_pipe(env)
        try:
            self.child = subprocess.Popen(list(command), start_new_session=True, env=env,
                                          pass_fds=() if token_fd is None else (token_fd,))
            if token_fd is not None:
                os.close(token_fd)
                token_fd = None
            for sig in self.pending:
                self._pass_on(sig)
            status = self.child.wait()
        finally:
            if token_fd is not None:  # the child never started
                os.close(token_fd)
            for sig, handler in saved.items():
                signal.signal(sig, handler)
        return status if status >= 0 else 128 - status

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        if self.child is None:
            self.pending.append(signal.Signals(number))
        else:
            self._pass_on(signal.Signals(number))

    def _pass_on(self, sig: signal.Signals) -> None:
        assert self.child is not None
        if self.child.poll() is not None:
            return
        if FORWARDED[sig] is signal.SIGKILL:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child.pid, signal.SIGKILL)
        else:
            self.child.send_signal(FORWARDED[sig])


def _die_with_parent() -> None:
    """SIGTERM to this process when its parent (the supervisor) exits: Linux's
    ``PR_SET_PDEATHSIG``; elsewhere nothing (the parent check above still runs)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
