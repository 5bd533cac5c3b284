"""Which third-party packages a model source uses, and their versions here.

Recorded in the manifest so that a load can warn when the host runs other versions of
transformers, torchvision, timm or qkan than the artifact was built with (their code runs
at load, and their numerics are in the references)."""

from __future__ import annotations

import sys
import types
from importlib.metadata import packages_distributions, version

import torch

from ..runtime import referenced_modules

#: Recorded elsewhere (producer) or part of qkan-pack itself.
_NOT_RECORDED = {"torch", "qkan_pack", "builtins", "__main__"}


def model_packages(module: types.ModuleType, model: torch.nn.Module) -> dict[str, str]:
    """``{distribution: version}`` for the top-level packages the source module refers to
    and the packages the model's submodule classes come from."""
    roots = {name.partition(".")[0] for name in referenced_modules(module, model)}
    roots -= _NOT_RECORDED | set(sys.stdlib_module_names)
    roots = {r for r in roots if not r.startswith("qkan_pack_model_")}
    distributions = packages_distributions()
    found: dict[str, str] = {}
    for root in sorted(roots):
        for name in distributions.get(root, []):
            found[name] = version(name)
    return found
