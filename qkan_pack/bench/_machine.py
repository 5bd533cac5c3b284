"""The machine a benchmark ran on."""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def machine_info(device: torch.device) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "hostname": platform.node(), "platform": platform.platform(terse=True),
        "python": platform.python_version(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
        "gpu": None, "gpu_memory_bytes": None, "cuda": torch.version.cuda,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["gpu_memory_bytes"] = int(props.total_memory)
        info["gpu_capability"] = f"{props.major}.{props.minor}"
    return info


def cpu_name() -> str:
    from ..runtime import cpu_model

    return cpu_model() or platform.machine()


