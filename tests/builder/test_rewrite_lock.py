"""``sign`` and ``warm`` rewrite an artifact in place: they read it, then install a new one.

A ``build --force`` into the same target that installed between the two was silently
undone: the old artifact, now signed or warmed, went back in over it, and both commands
said they succeeded. Both now read and write under the target's writer lock, so the build
lands either before the read (and is what gets signed or warmed) or after the write (and
stands, unsigned); either way one complete artifact, and each command's report true.

The races are made deterministic: a real build runs in a second thread, and a watch on the
target's lock tells when a thread has to wait for it.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import qkan_pack.builder._sign as sign_module
import qkan_pack.builder._warm as warm_module
import qkan_pack.builder._writer as writer
from qkan_pack import BuildResult, build, read_artifact
from qkan_pack.builder import sign, warm

from ..conftest import MODELS

MODEL = MODELS / "plain_mlp.py"
OLD_SEED, NEW_SEED = 0, 1  # different reference inputs: the two builds differ
SIG = "model.sig"
SETTLE_S = 120.0  # a bound for the test to fail on, never a wait: events end every wait


class LockWatch:
    """Sees which threads have to wait for ``target``'s writer lock (``waiting``)."""

    def __init__(self, target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lock_path = str(writer.output_path(target).parent / f".{target.name}.lock")
        self.waiting: dict[int, threading.Event] = {}
        real_flock = fcntl.flock

        def flock(fd: Any, operation: int) -> None:
            if operation == fcntl.LOCK_EX and self._is_target_lock(fd):
                try:
                    real_flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    self.event(threading.get_ident()).set()
            real_flock(fd, operation)

        monkeypatch.setattr(writer.fcntl, "flock", flock)

    def _is_target_lock(self, fd: Any) -> bool:
        number = fd if isinstance(fd, int) else fd.fileno()
        return os.readlink(f"/proc/self/fd/{number}") == self.lock_path

    def event(self, thread: int) -> threading.Event:
        return self.waiting.setdefault(thread, threading.Event())


class RacingBuild:
    """A real ``build(..., force=True)`` of a different artifact into ``target``, in a thread."""

    def __init__(self, target: Path, watch: LockWatch) -> None:
        self.target, self.watch = target, watch
        self.finished = threading.Event()
        self.result: BuildResult | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.result = build(MODEL, "1x2", output=self.target, seed=NEW_SEED, force=True,
                                progress=False)
        except BaseException as exc:  # reported by join(), in the test's thread
            self.error = exc
        finally:
            self.finished.set()

    def start_and_settle(self) -> None:
        """Start, and return once the build has installed or waits for the target's lock."""
        self.thread.start()
        assert self.thread.ident is not None
        waiting = self.watch.event(self.thread.ident)
        for _ in range(int(SETTLE_S / 0.05)):
            if self.finished.wait(0.05) or waiting.is_set():
                return
        pytest.fail("the racing build neither installed nor waited for the lock")

    def join(self) -> BuildResult:
        self.thread.join(SETTLE_S)
        assert not self.thread.is_alive(), "the racing build hung"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


@pytest.fixture(scope="module")
def signing_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from ..runtime.test_signing import write_key  # skips without the [sign] extra

    folder = tmp_path_factory.mktemp("key")
    write_key(folder, "a")
    return folder / "a.key", folder / "a.pub"


def old_artifact(tmp_path: Path) -> tuple[Path, BuildResult]:
    target = tmp_path / "art"
    return target, build(MODEL, "1x2", output=target, seed=OLD_SEED, progress=False)


def race_after_read(module: Any, racer: RacingBuild, monkeypatch: pytest.MonkeyPatch) -> None:
    """Start ``racer`` the moment ``module`` (sign or warm) has read the artifact."""
    real_read: Callable[..., Any] = module.read_artifact

    def read_then_race(*args: Any, **kwargs: Any) -> Any:
        artifact = real_read(*args, **kwargs)
        racer.start_and_settle()
        return artifact

    monkeypatch.setattr(module, "read_artifact", read_then_race)


def test_a_build_after_signs_read_is_not_undone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                signing_key: tuple[Path, Path]) -> None:
    """Before: the build installed between sign's read and write, then sign put the old
    artifact back (signed): the new build was gone, and both had said they succeeded."""
    target, old = old_artifact(tmp_path)
    racer = RacingBuild(target, LockWatch(target, monkeypatch))
    race_after_read(sign_module, racer, monkeypatch)
    signed = sign(target, signing_key[0])
    new = racer.join()
    final = read_artifact(target)
    assert final.digest == new.digest != old.digest, "the build was undone by the old artifact"
    assert signed.digest == old.digest  # sign signed what it read; the build came after it
    assert not (target / SIG).exists()  # and replaced it: unsigned, as a fresh build is


def test_sign_waiting_for_a_build_signs_the_new_artifact(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         signing_key: tuple[Path, Path]) -> None:
    """A build holding the lock when sign starts: sign waits for it, then reads and signs
    the new artifact. Before: sign read the old one meanwhile and put it back, signed."""
    target, old = old_artifact(tmp_path)
    watch = LockWatch(target, monkeypatch)
    racer = RacingBuild(target, watch)
    holding = threading.Event()
    real_stage = writer._stage_and_install

    def stage_once_sign_waits(*args: Any) -> None:
        if threading.current_thread() is racer.thread:
            holding.set()
            assert watch.event(threading.main_thread().ident or 0).wait(SETTLE_S), \
                "sign never waited for the build's lock"
        real_stage(*args)

    monkeypatch.setattr(writer, "_stage_and_install", stage_once_sign_waits)
    racer.thread.start()
    assert holding.wait(SETTLE_S)
    signed = sign(target, signing_key[0])
    new = racer.join()
    final = read_artifact(target, trusted_keys=[signing_key[1]])
    assert final.digest == signed.digest == new.digest != old.digest
    assert final.signed_by is not None


def test_a_build_after_warms_read_is_not_undone(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The same race through ``warm`` (CPU: the GPU steps replaced by a fake kernel set;
    the read, the store and the writer are the real ones). Before: the old artifact plus
    kernels went back over the new build."""
    import torch

    target, old = old_artifact(tmp_path)
    racer = RacingBuild(target, LockWatch(target, monkeypatch))
    race_after_read(warm_module, racer, monkeypatch)

    def compile_fake_kernels(root: Path, device: str, scratch: Path, *_: Any) -> None:
        (scratch / "triton" / "k1").mkdir(parents=True)
        (scratch / "triton" / "k1" / "kernel.cubin").write_bytes(b"\x7fELF fake")

    monkeypatch.setattr(warm_module, "check_warm_device", lambda device: torch.device("cuda", 0))
    monkeypatch.setattr(warm_module, "kernel_key", lambda index: ("sm90-test", {"arch": "sm_90"}))
    monkeypatch.setattr(warm_module, "_compile_in_child", compile_fake_kernels)
    warmed = warm(target, "cuda")
    new = racer.join()
    final = read_artifact(target)
    assert final.digest == new.digest != old.digest, "the build was undone by the old artifact"
    assert warmed.digest not in (old.digest, new.digest)  # warm wrote old + kernels, then
    assert final.manifest.kernels == ()  # the build replaced it, as --force does


def test_no_lock_file_is_left_beside_the_artifact(tmp_path: Path) -> None:
    """A `.NAME.lock` file was left beside every artifact built."""
    from qkan_pack import build

    build(MODELS / "plain_mlp.py", "2x2", output=tmp_path / "art", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_the_removed_lock_file_still_excludes_every_other_writer(tmp_path: Path) -> None:
    """Each holder removes the lock file; a waiter that got the lock on a removed file takes
    it again on the current one, so that two writers are never inside at once."""
    import threading
    import time

    from qkan_pack.builder._writer import _target_lock

    inside, worst, lock = [0], [0], threading.Lock()

    def writer() -> None:
        for _ in range(25):
            with _target_lock(tmp_path / "art"):
                with lock:
                    inside[0] += 1
                    worst[0] = max(worst[0], inside[0])
                time.sleep(0.0005)
                with lock:
                    inside[0] -= 1

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert worst[0] == 1 and not list(tmp_path.iterdir())
