"""Which third-party packages a model source uses, and their versions here.

Recorded in the manifest so that a load can warn when the host runs other versions of
transformers, torchvision, timm or qkan than the artifact was built with (their code runs
at load, and their numerics are in the references)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable
from importlib.metadata import packages_distributions, version
from typing import Any

import torch

#: Recorded elsewhere (producer) or part of qkan-pack itself.
_NOT_RECORDED = {"torch", "qkan_pack", "builtins", "__main__"}


def model_packages(module: types.ModuleType, model: torch.nn.Module) -> dict[str, str]:
    """``{distribution: version}`` for the top-level packages the source module refers to
    and the packages the model's submodule classes come from."""
    roots = {_root(name) for name in _module_names(module, model)}
    roots -= _NOT_RECORDED | set(sys.stdlib_module_names)
    roots = {r for r in roots if not r.startswith("qkan_pack_model_")}
    distributions = packages_distributions()
    found: dict[str, str] = {}
    for root in sorted(roots):
        for name in distributions.get(root, []):
            found[name] = version(name)
    return found


def _module_names(module: types.ModuleType, model: torch.nn.Module) -> Iterable[str]:
    for value in vars(module).values():
        name = _defining_module(value)
        if name:
            yield name
    for submodule in model.modules():
        yield type(submodule).__module__


def _defining_module(value: Any) -> str | None:
    if isinstance(value, types.ModuleType):
        return value.__name__
    name = getattr(value, "__module__", None)
    return name if isinstance(name, str) else None


def _root(name: str) -> str:
    return name.split(".", 1)[0]
