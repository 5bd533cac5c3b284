"""Weights out of the user's model and files: tied tensors stored once, checkpoints read
without unpickling code (``weights_only=True``), ``--weights`` read through the one reader of
supplied files (a FIFO or a device is refused without waiting on it or reading it)."""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors.torch import save as save_safetensors

from ..errors import FileReadError, ModelSourceError, WeightsMismatchError
from ..runtime import open_regular_file, parse_weights, read_regular_file

_CHECKPOINT_KEYS = ("state_dict", "model_state_dict", "model")
#: The largest ``--weights`` file: a bound for a file that is no weights at all, far above
#: any model built on one host (a safetensors file is held whole while it is parsed; a
#: checkpoint streams through ``torch.load``).
MAX_WEIGHTS_BYTES = 1024**4


def check_storable(model: torch.nn.Module, model_path: str) -> None:
    """Every state-dict entry is a plain tensor safetensors can store: quantized modules
    (``torch.ao.quantization``: packed parameters, a ``torch.dtype`` entry, quantized
    tensors) are refused here, naming the entry, rather than failing deep in the build."""
    for name, value in model.state_dict(keep_vars=True).items():
        if not isinstance(value, torch.Tensor) or value.is_quantized:
            kind = f"a quantized {value.dtype} tensor" if isinstance(value, torch.Tensor) \
                else f"a {type(value).__name__}"
            raise ModelSourceError(
                f"{model_path}: state dict entry {name!r} is {kind}; qkan-pack stores plain "
                "tensors (safetensors) and replays CUDA graphs, which quantized modules "
                "(torch.ao.quantization) cannot run in: build the float model",
                stage="factory", path=model_path)


def tied_groups(model: torch.nn.Module) -> list[list[str]]:
    """Groups of state-dict names that share one storage (e.g. an LM head tied to embeddings)."""
    by_storage: dict[tuple[int, int, tuple[int, ...]], list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if tensor.device.type == "meta" or tensor.numel() == 0:
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        by_storage.setdefault(key, []).append(name)
    return sorted(sorted(names) for names in by_storage.values() if len(names) > 1)


def weights_bytes(model: torch.nn.Module, tied: Sequence[Sequence[str]]) -> bytes:
    """Serialise every parameter and persistent buffer; each tied group once (first name)."""
    aliases = {name for group in tied for name in group[1:]}
    tensors = {
        name: tensor.detach().to("cpu").contiguous().clone()
        for name, tensor in model.state_dict().items()
        if name not in aliases
    }
    return save_safetensors(tensors, metadata={"format": "pt"})


def read_user_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Read ``--weights``: a safetensors file, or a torch checkpoint with ``weights_only=True``."""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            return parse_weights(read_regular_file(path, limit=MAX_WEIGHTS_BYTES), str(path))
        with open_regular_file(path, limit=MAX_WEIGHTS_BYTES) as handle:
            return _read_checkpoint(handle, path)
    except FileReadError as exc:
        raise WeightsMismatchError(source=str(path), reason=exc.problem) from None


#: Terminal escape sequences some libraries put in their messages.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _read_checkpoint(handle: BinaryIO, path: Path) -> dict[str, torch.Tensor]:
    """A torch checkpoint streamed from ``handle``, the opened ``path``."""
    try:
        state = torch.load(handle, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # weights_only refused an object: a pickled model
        raise WeightsMismatchError(
            source=str(path), reason="it holds pickled Python objects (a whole model saved "
            "with torch.save(model)?), which qkan-pack never unpickles: save the weights "
            "with torch.save(model.state_dict(), path) or as safetensors") from None
    except Exception as exc:  # torch raises RuntimeError, EOFError, ...
        text = _ANSI.sub("", str(exc)).strip()  # torch marks words in bold for terminals
        first = text.splitlines()[0] if text else type(exc).__name__
        raise WeightsMismatchError(
            source=str(path), reason=f"cannot read it as a PyTorch state dict with "
            f"weights_only=True: {first}. Save weights with torch.save(model.state_dict(), "
            "path) or safetensors") from None
    if isinstance(state, Mapping):
        for key in _CHECKPOINT_KEYS:
            if isinstance(state.get(key), Mapping) and all(
                isinstance(k, str) for k in state[key]
            ):
                state = state[key]
                break
    if not isinstance(state, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise WeightsMismatchError(
            source=str(path), reason="not a state dict (a mapping of names to tensors, "
            f"optionally under one of {_CHECKPOINT_KEYS})")
    return dict(state)


