"""The one device resolver (text or ``torch.device`` in, a device that exists here out), and
the early start of a GPU's context that a load overlaps with its CPU work."""

from __future__ import annotations

import threading

import torch

from ..errors import DeviceError
from ..format import check_device_text

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["resolve_device"]



def resolve_device(device: str | torch.device) -> torch.device:
    """Parse a device and check it exists here; a missing GPU is an error, not a crash.

    ``"auto"`` is ``cuda`` where CUDA is available, else ``cpu``; ``cuda`` is the current
    CUDA device, returned with its index so that callers can pin work to it.
    """
    if isinstance(device, str):
        check_device_text(device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(requested=str(device), problem=f"not a device ({exc}); write cpu, "
                          "cuda, cuda:N or auto", usage=True) from None
    if resolved.type == "cpu":
        return resolved
    if resolved.type != "cuda":
        raise DeviceError(requested=str(device), problem=f"{resolved.type} devices are not "
                          "supported; write cpu, cuda, cuda:N or auto", usage=True)
    if not torch.cuda.is_available():
        raise DeviceError(requested=str(device), problem="CUDA is not available on this host "
                          "(no GPU or a CPU-only torch build)", suggestion="cpu")
    index = resolved.index if resolved.index is not None else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise DeviceError(requested=str(device), problem=f"this host has {count} CUDA device(s)",
                          suggestion="cuda:0")
    return torch.device("cuda", index)


class ContextStart:
    """``target``'s CUDA context and cuBLAS handle, being created on a helper thread.

    Why: creating the primary context takes on the order of 0.1 s and runs in the driver with
    the GIL released, so the load verifies the artifact, matches shipped kernels and imports
    Triton meanwhile instead of afterwards (process start -> first result is the figure
    users time). The tiny matmul creates the cuBLAS handle the first forward would create;
    nothing here synchronizes the device, which would break another thread's graph capture.
    torch returns a thread's handles to its pool when the thread ends, so ``wait`` joins the
    thread (not just its work) before the load's own CUDA work reuses them. An error there
    (a busy or lost GPU) is raised by ``wait``, in the caller's thread, as it was raised.
    """

    def __init__(self, target: torch.device) -> None:
        self._target = target
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._create, name="qkan-pack-cuda-context",
                                        daemon=True)
        self._thread.start()

    def _create(self) -> None:
        try:
            ones = torch.ones(2, 2, device=self._target)
            torch.mm(ones, ones)
        except BaseException as error:  # re-raised by wait() in the loading thread
            self._error = error
        finally:
            self._done.set()

    def wait(self) -> None:
        """Block until the context exists; raise what creating it raised."""
        self.join()
        if self._error is not None:
            raise self._error

    def join(self) -> None:
        """Block until the thread ended, raising nothing: for a load that failed before it
        needed the GPU, whose own error is the one to report. Waits on an event first: a
        Ctrl-C that interrupts ``Thread.join`` can leave it reporting a running thread as
        ended (CPython 3.11), and this join then runs again from the load's ``finally``."""
        self._done.wait()
        self._thread.join()
