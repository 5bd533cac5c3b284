"""``qkan_pack._session``: the supervisor that runs ``qkan-pack serve`` as a child in a session
of its own, driven here with a stand-in child that records the signals it gets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qkan_pack._session import CHILD_ENV

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX sessions")

CHILD = """
import os, signal, sys, time
log = sys.argv[1]
def note(sig, frame):
    with open(log, "a") as f:
        f.write(signal.Signals(sig).name + "\\n")
    if sig == signal.SIGTERM:
        sys.exit(3)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, note)
with open(log, "a") as f:
    f.write(f"ready {os.getsid(0) == os.getpid()}\\n")
while True:
    time.sleep(0.02)
"""
SUPERVISOR = ("import sys; from qkan_pack._session import run_in_own_session; "
              "sys.exit(run_in_own_session([], [sys.executable, '-c', sys.argv[1], sys.argv[2]]))")


def _start(log: Path, ignore_hup: bool = False) -> subprocess.Popen[bytes]:
    def preexec() -> None:
        if ignore_hup:  # as nohup leaves it
            signal.signal(signal.SIGHUP, signal.SIG_IGN)

    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR, CHILD, str(log)],
                                  start_new_session=True, preexec_fn=preexec)
    deadline = time.monotonic() + 30
    while not (log.exists() and "ready" in log.read_text()):
        assert time.monotonic() < deadline and supervisor.poll() is None
        time.sleep(0.02)
    return supervisor


def _lines(log: Path) -> list[str]:
    return log.read_text().split()


def test_a_sigterm_to_the_group_reaches_the_child_once_in_its_own_session(tmp_path: Path) -> None:
    """``kill -TERM -PGID`` on the command: the child (in a new session, so outside that
    group) gets exactly one SIGTERM, passed on by the supervisor, whose status is the child's."""
    log = tmp_path / "log"
    supervisor = _start(log)
    os.killpg(supervisor.pid, signal.SIGTERM)
    assert supervisor.wait(30) == 3
    assert _lines(log) == ["ready", "True", "SIGTERM"]


def test_ctrl_c_is_passed_on_as_sigint_and_sigquit_kills_the_child(tmp_path: Path) -> None:
    log = tmp_path / "log"
    supervisor = _start(log)
    os.killpg(supervisor.pid, signal.SIGINT)
    deadline = time.monotonic() + 10
    while "SIGINT" not in _lines(log) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(supervisor.pid, signal.SIGQUIT)  # Ctrl-\: force-quit
    assert supervisor.wait(30) == 128 + signal.SIGKILL
    assert _lines(log) == ["ready", "True", "SIGINT"]


def test_a_hangup_ignored_under_nohup_stays_ignored(tmp_path: Path) -> None:
    """Review: the supervisor replaced an inherited SIG_IGN for SIGHUP and passed it on as
    SIGTERM, so a ``nohup qkan-pack serve &`` stopped when its terminal closed."""
    log = tmp_path / "log"
    supervisor = _start(log, ignore_hup=True)
    os.kill(supervisor.pid, signal.SIGHUP)
    time.sleep(0.5)
    assert supervisor.poll() is None and _lines(log) == ["ready", "True"]
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == 3


def test_the_child_runs_the_command_only_under_its_own_supervisor() -> None:
    """In a process of its own (the check sets this process's parent-death signal)."""
    check = ("import os, sys; from qkan_pack._session import CHILD_ENV, run_in_own_session; "
             "print(run_in_own_session(['serve']), CHILD_ENV in os.environ)")
    as_child = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                              env={**os.environ, CHILD_ENV: str(os.getpid())}, timeout=60)
    assert as_child.stdout.split() == ["None", "False"], as_child.stderr
    orphan = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                            env={**os.environ, CHILD_ENV: "1"}, timeout=60)  # supervisor gone
    assert orphan.returncode == 128 + signal.SIGTERM and not orphan.stdout


def test_a_token_in_the_environment_reaches_the_child_through_a_pipe_only() -> None:
    """Audit (issue 32, item 9): a token given in QKAN_PACK_SERVE_TOKEN was passed on in the
    environment of the serve and of everything it started (Ray's processes, the replicas
    running model code). The supervisor hands it over through a pipe: the child's
    environment, as the kernel shows it to other processes, never holds it."""
    token = "env-token-0123456789abcdef"
    child = ("import json, os, sys\n"
             "from qkan_pack._session import handed_over_token, run_in_own_session\n"
             "assert run_in_own_session([]) is None\n"
             "with open('/proc/self/environ', 'rb') as f:\n"
             "    environ = f.read()\n"
             "print(json.dumps([handed_over_token(), sys.argv[1].encode() in environ,\n"
             "                  sorted(k for k in os.environ if 'QKAN_PACK_SERVE' in k)]))\n")
    supervisor = ("import sys; from qkan_pack._session import run_in_own_session; "
                  "sys.exit(run_in_own_session([], [sys.executable, '-c', sys.argv[1], "
                  "sys.argv[2]]))")
    done = subprocess.run([sys.executable, "-c", supervisor, child, token], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "QKAN_PACK_SERVE_TOKEN": token})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [token, False, []]
    alone = subprocess.run([sys.executable, "-c", supervisor, child, token], capture_output=True,
                           text=True, timeout=60,
                           env={k: v for k, v in os.environ.items()
                                if k != "QKAN_PACK_SERVE_TOKEN"})
    assert json.loads(alone.stdout) == [None, False, []], alone.stderr
