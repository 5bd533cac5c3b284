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
