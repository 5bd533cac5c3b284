"""Large request bodies parsed (``POST /`` and the Open Inference Protocol's ``infer``), and
large replies encoded, in a helper process of the replica.

Why a process and not a thread: orjson and numpy hold the GIL for the whole of a call, so
parsing a body in a worker thread still stops the replica's event loop, and with it every
small request, for as long as the parse takes: a body of megabytes of numbers takes a tenth
of a second or more to parse (orjson then numpy), a list reply of that size tens of
milliseconds to encode, and every single-row request behind them waits as long
(measurements: ``benchmarks/results/2026-12-05_cpu_large-bodies.md``). In a helper the
replica's loop only waits on a pipe; what crosses it is the body in and numpy arrays out
(pickle protocol 5, a small fraction of the parse).

One helper per replica (``HELPER_MAIN``: numpy and orjson, no torch), started on first use,
one job at a time. It exits when its socket closes, so it never outlives the replica. A job
whose helper died (killed, out of memory) or went silent past ``job_timeout_s`` runs in the
calling thread instead, as without a helper, and the next job starts a fresh helper.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from ._oip import InferRequest, OipModel
from ._wire import encode_reply, parse_request

logger = logging.getLogger(__name__)

#: The helper's program (``-c``: ``-m`` would warn that the package imported it first).
HELPER_MAIN = "from qkan_pack.serve._offload import main; main()"
#: Helper failures in a row after which a replica stops starting new ones.
MAX_FAILURES = 3
def job_timeout_s(payload_bytes: int) -> float:
    """How long a job may take in the helper: 10 s, plus 2 s per MB, far beyond what a parse
    takes (a fraction of a second per MB), so that only a stuck helper reaches it."""
    return 10.0 + 2.0 * payload_bytes / 2**20


def parse_infer(oip: OipModel, body: bytes, header_length: str | None) -> InferRequest:
    """``oip.parse_http(body, header_length)``: the model's protocol view travels with the
    job (a few names and dtypes)."""
    return oip.parse_http(body, header_length)


#: What the helper does, by name (the parent sends the name and the arguments).
JOBS: dict[str, Callable[..., Any]] = {"parse": parse_request, "parse_infer": parse_infer,
                                       "encode": encode_reply}


class WireHelper:
    """The replica's helper process; ``parse``/``encode`` are awaitable and never run on
    the event loop's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one job at a time on the one connection
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: Connection | None = None
        self._failures = 0  # in a row; at MAX_FAILURES jobs stay in the replica

    async def parse(self, body: bytes, names: Sequence[str]) -> Any:
        """``parse_request(body, names)``, done in the helper."""
        return await asyncio.to_thread(self.run, "parse", body, tuple(names))

    async def parse_infer(self, oip: OipModel, body: bytes,
                          header_length: str | None) -> InferRequest:
        """``oip.parse_http(body, header_length)``, done in the helper."""
        return await asyncio.to_thread(self.run, "parse_infer", oip, body, header_length)

    async def encode(self, outputs: Any, encoding: str) -> bytes:
        """``encode_reply(outputs, encoding)``, done in the helper."""
        return await asyncio.to_thread(self.run, "encode", outputs, encoding)

    def run(self, job: str, *args: Any) -> Any:
        """``JOBS[job](*args)`` in the helper (blocking; call it off the event loop); its
        exception is raised here. Done here instead when the helper cannot be reached."""
        with self._lock:
            if self._failures < MAX_FAILURES:
                try:
                    ok, value = self._exchange(job, args)
                    self._failures = 0
                except (OSError, EOFError) as exc:  # it died, hung, or could not start
                    self._failed(exc)
                    ok = None
            else:
                ok = None
        if ok is None:  # outside the lock: the next job need not wait for this one
            return JOBS[job](*args)
        if ok:
            return value
        raise value

    def _exchange(self, job: str, args: tuple) -> tuple[bool, Any]:
        """Send one job, wait for its reply; a helper silent past ``job_timeout_s`` is
        treated as dead (``TimeoutError``), so a stopped or stuck helper holds no request."""
        connection = self._connected()
        payload = pickle.dumps((job, args), protocol=5)
        connection.send_bytes(payload)
        if not connection.poll(job_timeout_s(len(payload))):
            raise TimeoutError(f"no reply from the helper in {job_timeout_s(len(payload)):g} s")
        return pickle.loads(connection.recv_bytes())

    @property
    def pid(self) -> int | None:
        """The helper's process id while it runs (tests, diagnostics)."""
        return self._process.pid if self._process is not None else None

    def _connected(self) -> Connection:
        if self._connection is None:
            ours, theirs = socket.socketpair()
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-c", HELPER_MAIN, str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, close_fds=True,
                    env=_helper_environment())
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            self._connection = Connection(ours.detach())
        return self._connection

    def _failed(self, exc: BaseException) -> None:
        self._discard()
        self._failures += 1
        what = f"{type(exc).__name__}: {exc}"
        if self._failures < MAX_FAILURES:
            logger.warning("the wire helper process is gone (%s); this job runs in the "
                           "replica's thread, the next starts a new helper", what)
        else:
            logger.error("the wire helper process failed %d times in a row (%s); large "
                         "bodies are parsed in the replica's threads from now on, which "
                         "holds up small requests while they parse", self._failures, what)

    def _discard(self) -> None:
        connection, process = self._connection, self._process
        self._connection = self._process = None
        if connection is not None:
            connection.close()
        if process is not None:
            process.kill()
            process.wait()

    def close(self) -> None:
        """Stop the helper (it exits once its pipe closes)."""
        with self._lock:
            self._discard()


def _helper_environment() -> dict[str, str]:
    """The replica's environment, with its module path: a Ray worker may import qkan-pack
    from a path it was given at run time (a runtime environment), not from its variables."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def serve_jobs(connection: Connection) -> None:
    """The helper's loop: a job in, ``(True, result)`` or ``(False, exception)`` out, until
    the replica closes its end."""
    while True:
        try:
            job, args = pickle.loads(connection.recv_bytes())
        except EOFError:
            return
        try:
            reply: tuple[bool, Any] = (True, JOBS[job](*args))
        except Exception as exc:
            reply = (False, exc)
        try:
            payload = pickle.dumps(reply, protocol=5)
        except Exception as exc:  # an exception that does not pickle: its text does
            payload = pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")))
        try:
            connection.send_bytes(payload)
        except OSError:  # the replica is gone
            return


def main() -> None:
    """The helper process (``HELPER_MAIN``): serve jobs on the inherited socket ``argv[1]``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the replica decides when this stops
    serve_jobs(Connection(int(sys.argv[1])))
    os._exit(0)  # nothing to clean up; skip interpreter teardown
