"""qkan-pack: package launch-bound PyTorch models into verified artifacts served by
pre-captured CUDA graphs.

``import qkan_pack`` is cheap: torch is imported only when a torch-backed name
(``build``, ``Predictor``, ...) is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_getattr
from ._version import __version__
from .errors import *  # noqa: F403  (every error class: errors.__all__ is the list)
from .errors import __all__ as _ERRORS
from .format import FORMAT_NAME, FORMAT_VERSION, Manifest, parse_manifest, parse_shapes

if TYPE_CHECKING:
    from .builder import BuildOptions, BuildResult, build
    from .runtime import LoadOptions, LoadReport, Predictor, VerifiedArtifact, read_artifact

#: Names resolved on first use, so that ``import qkan_pack`` does not import torch.
_LAZY = {
    "BuildOptions": ".builder",
    "BuildResult": ".builder",
    "build": ".builder",
    "LoadOptions": ".runtime",
    "LoadReport": ".runtime",
    "Predictor": ".runtime",
    "VerifiedArtifact": ".runtime",
    "read_artifact": ".runtime",
}

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "BuildOptions",
    "BuildResult",
    "LoadOptions",
    "LoadReport",
    "Manifest",
    "Predictor",
    "VerifiedArtifact",
    "__version__",
    "build",
    "parse_manifest",
    "parse_shapes",
    "read_artifact",
    *_ERRORS,
]


__getattr__ = lazy_getattr(__name__, globals(), _LAZY)


def __dir__() -> list[str]:
    return sorted(__all__)
