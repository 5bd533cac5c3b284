"""qkan-pack: package launch-bound PyTorch models into verified artifacts served by
pre-captured CUDA graphs.

``import qkan_pack`` is cheap: torch is imported only when a torch-backed name
(``build``, ``Predictor``, ...) is first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    ArtifactError,
    CaptureError,
    DeviceError,
    DigestMismatchError,
    IncompatibleArtifactError,
    InputError,
    KernelCacheError,
    ManifestError,
    ModelSourceError,
    QkanPackError,
    SelfTestError,
    ShapeSpecError,
    WeightsMismatchError,
)
from .spec import FORMAT_NAME, FORMAT_VERSION, Manifest, parse_manifest, parse_shapes

if TYPE_CHECKING:
    from .artifact import VerifiedArtifact, read_artifact
    from .build import BuildResult, build
    from .predictor import LoadReport, Predictor

_LAZY = {
    "BuildResult": "build",
    "build": "build",
    "LoadReport": "predictor",
    "Predictor": "predictor",
    "VerifiedArtifact": "artifact",
    "read_artifact": "artifact",
}

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "ArtifactError",
    "BuildResult",
    "CaptureError",
    "DeviceError",
    "DigestMismatchError",
    "IncompatibleArtifactError",
    "InputError",
    "KernelCacheError",
    "LoadReport",
    "Manifest",
    "ManifestError",
    "ModelSourceError",
    "Predictor",
    "QkanPackError",
    "SelfTestError",
    "ShapeSpecError",
    "VerifiedArtifact",
    "WeightsMismatchError",
    "__version__",
    "build",
    "parse_manifest",
    "parse_shapes",
    "read_artifact",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'qkan_pack' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
