"""qkan-pack: package launch-bound PyTorch models into verified artifacts served by
pre-captured CUDA graphs.

``import qkan_pack`` is cheap: it loads the error classes and the version, nothing else.
Every other name imports its module when first used: the format's (the manifest, its
parsers) and, for torch-backed ones (``build``, ``Predictor``, ...), torch.
"""

from __future__ import annotations

from ._lazy import lazy_getattr
from ._version import __version__
from .errors import *  # noqa: F403  (every error class: errors.__all__ is the list)
from .errors import __all__ as _ERRORS

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (docs/ARCHITECTURE.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .builder import BuildOptions, BuildResult, build
    from .format import FORMAT_NAME, FORMAT_VERSION, Manifest, parse_manifest, parse_shapes
    from .runtime import LoadOptions, LoadReport, Predictor, VerifiedArtifact, read_artifact

#: Names resolved on first use: the format's, so that ``import qkan_pack`` creates none of
#: its dataclasses, and the torch-backed ones, so that it does not import torch.
_LAZY = {
    "FORMAT_NAME": ".format",
    "FORMAT_VERSION": ".format",
    "Manifest": ".format",
    "parse_manifest": ".format",
    "parse_shapes": ".format",
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
