"""Why a capture failed: the op and the model source line that cannot live in a CUDA graph.

A failed capture surfaces as a CUDA error ("operation not permitted when stream is
capturing") that names neither the op nor the line. After the context is recovered, the
same call runs once more, eagerly, under a dispatch mode that watches for what a graph
cannot hold: values read back to the host (``.item()``, ``bool(tensor)``, ``.tolist()``:
``aten::_local_scalar_dense``), ops whose output size depends on data (``nonzero``,
``masked_select``, ``unique``), and copies between the host and the device (a tensor made on
the CPU inside ``forward`` and moved to the GPU), nested tensors (sized from data on the
host), and any op torch tags as data-dependent. The first one found is reported with the
innermost frame of user code that issued it.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._source import shown_path

#: Internal to ``qkan_pack.runtime``: the package exports nothing from this module.
__all__: list[str] = []

_HOST_SYNC = {
    "aten::_local_scalar_dense": ".item(), bool(), int() or .tolist() reads a value back to "
                                 "the host",
    "aten::nonzero": "its output size depends on the data",
    "aten::masked_select": "its output size depends on the data",
    "aten::unique_consecutive": "its output size depends on the data",
    "aten::_unique2": "its output size depends on the data",
    "aten::unique_dim": "its output size depends on the data",
    "aten::repeat_interleave": "its output size depends on the data",
}
#: Frames inside torch and qkan-pack are not "where the model did it".
_SKIPPED_ROOTS = (os.path.dirname(torch.__file__) + os.sep,
                  os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)


# torch leaves TorchDispatchMode's __init_subclass__ and __init__ unannotated
class _Watch(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the first capture-unsafe op and where user code called it."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.device = device
        self.found: str | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if self.found is None:
            reason = _unsafe(func, args, kwargs, self.device)
            if reason is not None:
                self.found = f"{reason}{_user_frame()}"
        return func(*args, **kwargs)


def _unsafe(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], device: torch.device) -> str | None:
    name = func._schema.name
    if name in _HOST_SYNC:
        return f"{name} ({_HOST_SYNC[name]})"
    if name.startswith("aten::_nested_tensor_from_mask") or any(
            t.is_nested for t in _tensors(args, kwargs)):
        return (f"{name} (nested tensors take their sizes from the data "
                "on the host: nn.TransformerEncoder's fast path with a padding mask builds "
                "them; construct it with enable_nested_tensor=False)")

    if name in ("aten::index", "aten::index_put", "aten::index_put_") and any(
            t.dtype == torch.bool for t in _tensors(tuple(args[1]) if len(args) > 1 and
                                                    isinstance(args[1], (list, tuple)) else (), {})):
        return f"{name} with a boolean mask (the number of selected elements depends on the data)"
    if name in ("aten::_to_copy", "aten::copy_"):
        devices = {t.device.type for t in _tensors(args, kwargs)}
        target = kwargs.get("device")
        if target is not None:
            devices.add(torch.device(target).type)
        if "cpu" in devices and device.type in devices:
            return f"{name} (a copy between the host and {device.type}: make tensors on the " \
                   "device inside forward, or register them as buffers)"
    tags = getattr(func, "tags", ())
    if torch.Tag.data_dependent_output in tags:
        return f"{name} (its result is read back to the host)"
    if torch.Tag.dynamic_output_shape in tags and not name.startswith("aten::index"):
        return f"{name} (its output size depends on the data)"  # index: only a bool mask
    return None


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    return [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]


def _user_frame() -> str:
    """`` at file:line`` of the innermost frame outside torch and qkan-pack, if any."""
    for frame in reversed(traceback.extract_stack()):
        filename = os.path.abspath(frame.filename)
        if not filename.startswith(_SKIPPED_ROOTS) and "<frozen" not in frame.filename:
            return f" at {shown_path(frame.filename)}:{frame.lineno}"
    return ""


def explain_capture_failure(fn: Callable[..., Any], inputs: Sequence[torch.Tensor],
                            device: torch.device) -> str | None:
    """Run ``fn`` eagerly and name the first op a CUDA graph cannot capture (None: none
    found, e.g. the failure came from a library's own stream or allocator use)."""
    watch = _Watch(device)
    try:
        with torch.no_grad(), watch:
            fn(*inputs)
    except Exception:  # the diagnosis must never hide the original failure
        pass
    return watch.found
