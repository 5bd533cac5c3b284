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
        raise DeviceError(f"bad device {device!r}: {exc}; use 'cpu', 'cuda' or 'cuda:N'") from None
    if resolved.type == "cpu":
        return resolved
    if resolved.type != "cuda":
        raise DeviceError(f"device {device!r} is not supported; use 'cpu', 'cuda' or 'cuda:N'")
    if not torch.cuda.is_available():
        raise DeviceError(
            f"device {device!r} was asked for but CUDA is not available on this host "
            "(no GPU or a CPU-only torch build); load with device='cpu'"
        )
    index = resolved.index if resolved.index is not None else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise DeviceError(f"device {device!r} does not exist: this host has {count} CUDA device(s)")
    return torch.device("cuda", index)
