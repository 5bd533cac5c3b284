"""Weights into a rebuilt model: tied tensors re-tied, loading strictly.

``torch.nn.Module.load_state_dict`` silently casts dtypes and a non-strict load silently
keeps initial values; a packager must do neither. Every mismatch is listed in one error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from ..errors import ArtifactError, WeightsMismatchError
from ._artifact import safetensors_header

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["load_strict", "parse_weights"]



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


def load_strict(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor],
                tied: Sequence[Sequence[str]], source: str) -> None:
    """Load ``tensors`` into ``model`` or raise listing every key that does not fit exactly."""
    retie(model, tied)
    expected = model.state_dict()
    full = expand_aliases(tensors, tied, source)
    problems = _mismatches(expected, full)
    if problems:
        raise WeightsMismatchError(source=source, problems=problems)
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
                    source=source, reason=f"{name} and {present[0]} are tied in the model but "
                    "hold different values; save them tied or untie the model")
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
