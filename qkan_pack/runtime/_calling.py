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


def bind_forward(model: torch.nn.Module, names: Sequence[str], call: str) -> Callable[..., Any]:
    """A callable taking the inputs' tensors in declared order and calling ``model`` as the
    manifest says (``call``: ``keyword`` or ``positional``)."""
    if call != "keyword":
        return model
    keys = tuple(names)

    def forward(*tensors: Any) -> Any:
        return model(**dict(zip(keys, tensors)))

    return forward


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
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
