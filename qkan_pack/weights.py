"""Weights in and out of safetensors: tied tensors stored once, loading strictly.

``torch.nn.Module.load_state_dict`` silently casts dtypes and a non-strict load silently
keeps initial values; a packager must do neither. Every mismatch is listed in one error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from .artifact import safetensors_header
from .errors import ArtifactError, WeightsMismatchError

_CHECKPOINT_KEYS = ("state_dict", "model_state_dict", "model")


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


def parse_weights(data: bytes, where: str) -> dict[str, torch.Tensor]:
    """Parse untrusted safetensors bytes after auditing the header (size cap, strict JSON,
    offsets), so a hostile file cannot exhaust memory or confuse the parser."""
    safetensors_header(data, where)
    return parse_audited(data, where)


def parse_audited(data: bytes, where: str) -> dict[str, torch.Tensor]:
    """Parse safetensors bytes whose header ``read_artifact`` has already audited."""
    try:
        return load_safetensors(data)
    except (SafetensorError, ValueError, RuntimeError, OverflowError) as exc:
        raise ArtifactError(f"{where} is not a valid safetensors file: {exc}") from None


def read_user_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Read ``--weights``: a safetensors file, or a torch checkpoint with ``weights_only=True``."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WeightsMismatchError(f"cannot read weights {path}: {exc.strerror}") from None
    if path.suffix == ".safetensors":
        return parse_weights(data, str(path))
    return _read_checkpoint(path)


def _read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WeightsMismatchError(
            f"cannot read {path} as a PyTorch state dict with weights_only=True: {first}. "
            "Save weights with torch.save(model.state_dict(), path) or safetensors"
        ) from None
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
            f"{path} is not a state dict (a mapping of names to tensors, optionally under "
            f"one of {_CHECKPOINT_KEYS})"
        )
    return dict(state)


def load_strict(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor],
                tied: Sequence[Sequence[str]], source: str) -> None:
    """Load ``tensors`` into ``model`` or raise listing every key that does not fit exactly."""
    retie(model, tied)
    expected = model.state_dict()
    full = expand_aliases(tensors, tied, source)
    problems = _mismatches(expected, full)
    if problems:
        raise WeightsMismatchError(
            f"weights from {source} do not fit the model:\n  " + "\n  ".join(problems)
        )
    with torch.no_grad():
        model.load_state_dict(full, strict=True)


def expand_aliases(tensors: Mapping[str, torch.Tensor], tied: Sequence[Sequence[str]],
                   source: str) -> dict[str, torch.Tensor]:
    """Fill each tied group's aliases from its stored name; conflicting copies are an error."""
    full = dict(tensors)
    for group in tied:
        present = [name for name in group if name in full]
        if not present:
            continue
        first = full[present[0]]
        for name in present[1:]:
            other = full[name]
            if other.shape != first.shape or not torch.equal(other, first):
                raise WeightsMismatchError(
                    f"weights from {source}: {name} and {present[0]} are tied in the model "
                    "but hold different values; save them tied or untie the model"
                )
        for name in group:
            full.setdefault(name, first)
    return full


def retie(model: torch.nn.Module, tied: Sequence[Sequence[str]]) -> None:
    """Make every recorded tied group share one Parameter again in a rebuilt model."""
    params = dict(model.named_parameters(remove_duplicate=False))
    for group in tied:
        if not all(name in params for name in group):
            continue
        primary = params[group[0]]
        for name in group[1:]:
            if params[name] is not primary:
                owner_path, _, attr = name.rpartition(".")
                owner = model.get_submodule(owner_path) if owner_path else model
                setattr(owner, attr, primary)


def _mismatches(expected: Mapping[str, torch.Tensor],
                provided: Mapping[str, torch.Tensor]) -> list[str]:
    problems = [f"missing: {name}" for name in sorted(set(expected) - set(provided))]
    problems += [f"unexpected: {name}" for name in sorted(set(provided) - set(expected))]
    for name in sorted(set(expected) & set(provided)):
        want, got = expected[name], provided[name]
        if tuple(want.shape) != tuple(got.shape):
            problems.append(
                f"shape of {name}: model has {tuple(want.shape)}, weights have {tuple(got.shape)}"
            )
        elif want.dtype != got.dtype:
            problems.append(f"dtype of {name}: model has {want.dtype}, weights have {got.dtype}")
    return problems
