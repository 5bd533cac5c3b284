"""The one device resolver: text or ``torch.device`` in, a device that exists here out."""

from __future__ import annotations

import torch

from ..errors import DeviceError


def resolve_device(device: str | torch.device) -> torch.device:
    """Parse a device and check it exists here; a missing GPU is an error, not a crash.

    ``"auto"`` is ``cuda`` where CUDA is available, else ``cpu``; ``cuda`` is the current
    CUDA device, returned with its index so that callers can pin work to it.
    """
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
