"""How declared inputs reach ``forward``: by keyword under their names, or positionally.

Named inputs must reach ``forward`` by keyword: passed positionally, a transformers model
reads ``token_type_ids`` as its ``attention_mask`` and answers wrongly without an error --
and a reference recorded the same way could never tell. Build, load, capture and every
benchmark variant call the model through ``bind_forward`` so they agree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["bind_forward", "full_float32"]



def bind_forward(model: torch.nn.Module, names: Sequence[str], call: str) -> Callable[..., Any]:
    """A callable taking the inputs' tensors in declared order and calling ``model`` as the
    manifest says (``call``: ``keyword`` or ``positional``)."""
    if call != "keyword":
        return model
    return KeywordForward(model, names)


class KeywordForward:
    """``model(**dict(zip(names, tensors)))``, as an object rather than a closure.

    A frame keeps the function it runs alive, ``frame.clear()`` notwithstanding, and a
    closure's cells with it: a closure over the model in a failed load's traceback would
    pin the model, its GPU weights and graphs for as long as the caller keeps the error.
    An object's frames hold it only through locals, which clearing drops.
    """

    __slots__ = ("keys", "model")

    def __init__(self, model: torch.nn.Module, names: Sequence[str]) -> None:
        self.model = model
        self.keys = tuple(names)

    def __call__(self, *tensors: Any) -> Any:
        return self.model(**dict(zip(self.keys, tensors)))


@contextlib.contextmanager
def full_float32(device: torch.device) -> Iterator[None]:
    """Float32 math without TF32 on ``device`` for the block, as the build host computed
    the references (CPUs have no TF32): matmuls at "highest" precision, cuDNN without TF32.

    Process-wide switches: the caller holds the capture-session lock so that no other
    load captures a graph while they are flipped.
    """
    if device.type != "cuda":
        yield
        return
    with tf32_switches(False):
        yield


@contextlib.contextmanager
def tf32_switches(allowed: bool) -> Iterator[None]:
    """torch's TF32 switches for matmuls and cuDNN set to ``allowed`` for the block, restored
    after (process-wide: the caller holds the capture-session lock)."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
