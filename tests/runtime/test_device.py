"""The GPU context a load starts early (``ContextStart``): its thread's error reaches the
loading thread unchanged, and no thread outlives the load. Runs on CPU and GPU hosts: a
device index that does not exist fails on both."""

from __future__ import annotations

import threading

import pytest
import torch

from qkan_pack.runtime._device import ContextStart

MISSING = torch.device("cuda", 99)


def _context_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "qkan-pack-cuda-context"]


def test_a_context_that_cannot_be_created_raises_in_the_waiting_thread() -> None:
    with pytest.raises((RuntimeError, AssertionError)) as direct:
        torch.ones(2, 2, device=MISSING)
    start = ContextStart(MISSING)
    start.join()  # a load that failed first only joins: nothing raised here
    assert not _context_threads()
    with pytest.raises(type(direct.value)) as waited:
        start.wait()
    assert str(waited.value) == str(direct.value)
    assert waited.value.__traceback__ is not None  # the thread's own frames, for the log


def test_ctrl_c_while_waiting_still_leaves_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit: a Ctrl-C inside ``wait`` interrupted ``Thread.join``, after which CPython 3.11
    reported the still-running thread as ended, so the load's ``finally: join()`` returned at
    once and left the thread creating a context behind it."""
    import signal
    import time
    import types

    from qkan_pack.runtime import _device

    def slow_ones(*args: object, **kwargs: object) -> torch.Tensor:
        time.sleep(0.6)
        return torch.ones(2, 2)

    fake = types.SimpleNamespace(ones=slow_ones, mm=torch.mm)
    monkeypatch.setattr(_device, "torch", fake)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        start = ContextStart(torch.device("cpu"))
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            start.wait()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    start.join()  # what the load's finally does
    assert not _context_threads()
