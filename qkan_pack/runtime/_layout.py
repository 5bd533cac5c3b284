"""Channels-last graphs: which models they apply to, and what a channels-last call computes.

A 2-D convolution on tensor cores computes in NHWC (torch's ``channels_last`` memory
format). Given NCHW tensors in half precision, cuDNN transposes around the convolutions,
and that can cost more than the tensor cores save; with the activations channels-last
from the first convolution on, nothing is transposed. So a shape whose graph is captured
``channels_last`` (``warm --precision auto`` chose it where it was timed faster, or a load
asked for it) runs ``ChannelsLastForward``: its 4-D floating inputs converted with
``x.contiguous(memory_format=torch.channels_last)`` and its 4-D outputs converted back
with ``.contiguous()``, both inside the call and so inside the captured graph. Callers
pass NCHW tensors and get contiguous outputs, as in the contiguous layout; the values are
what the convolutions compute in either layout (another kernel, the same arithmetic), and
the load's precision gate holds them to the float32 references as it holds any reduced
precision.

The model's 4-D weights are converted once at load (``to_channels_last``, torch's
``model.to(memory_format=torch.channels_last)``) when every shape runs channels-last. A
load that mixes layouts keeps them contiguous: a channels-last weight turns a
convolution's output channels-last whatever its input's layout, so the contiguous shapes
would no longer run what was timed for them; cuDNN then converts a contiguous weight
inside a channels-last shape's graph instead (one copy of the weights per call).

Not owned here: which layout a load runs (``_precision.resolve_precision``), the gate
(``_precision.check_precision``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..format import CHANNELS_LAST
from ._tree import flatten

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["channels_last_applies", "to_channels_last"]

#: Modules whose input a channels-last layout speeds up (their weights are 4-D).
_CONVOLUTIONS = (nn.Conv2d, nn.ConvTranspose2d)


def channels_last_applies(model: torch.nn.Module) -> bool:
    """Whether channels-last graphs are worth timing for ``model``: it has a 2-D convolution
    (``nn.Conv2d``, ``nn.ConvTranspose2d`` or a subclass), and no 5-D weight or buffer
    (torch's ``channels_last`` is a 4-D format: ``model.to`` refuses a 5-D tensor in it)."""
    if not any(isinstance(module, _CONVOLUTIONS) for module in model.modules()):
        return False
    tensors = [*model.parameters(), *model.buffers()]
    return not any(tensor.dim() == 5 for tensor in tensors)


def to_channels_last(model: torch.nn.Module) -> None:
    """Convert the model's 4-D weights and buffers to channels-last, in place, before any
    graph is captured (a graph bakes in the storage it reads)."""
    # documented (``Module.to(memory_format=...)``), not declared in torch's overloads
    model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]


class ChannelsLastForward:
    """``forward`` on channels-last copies of its 4-D floating inputs, its 4-D outputs made
    contiguous again: flat output leaves, as ``flat_forward`` gives them. An object, not a
    closure (``_calling.KeywordForward`` says why)."""

    __slots__ = ("forward",)

    def __init__(self, forward: Callable[..., Any]) -> None:
        self.forward = forward

    def __call__(self, *inputs: Any) -> list[torch.Tensor]:
        converted = [_channels_last(tensor) for tensor in inputs]
        return [leaf.contiguous() for leaf in flatten(self.forward(*converted))]


def _channels_last(tensor: Any) -> Any:
    if isinstance(tensor, torch.Tensor) and tensor.dim() == 4 and tensor.is_floating_point():
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor


def layout_forward(forward: Callable[..., Any], layout: str) -> Callable[..., Any]:
    """``forward`` as ``layout``'s graphs compute it: itself in the contiguous layout, a
    ``ChannelsLastForward`` channels-last."""
    return ChannelsLastForward(forward) if layout == CHANNELS_LAST else forward
