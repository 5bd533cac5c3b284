"""The whole qkan-pack error hierarchy.

Every error a user can trigger is a ``QkanPackError``; each also subclasses the
builtin that matches its nature, so ``except ValueError`` keeps working::

    QkanPackError
    ├── ShapeSpecError (ValueError)         bad --shapes / --dtype / --config text
    ├── ManifestError (ValueError)          missing/invalid field, unknown or newer format
    │   └── IncompatibleArtifactError       built for a newer format or an unsafe runtime
    ├── ArtifactError (OSError)             missing/extra file, size or sha256 mismatch,
    │   │                                   symlink, path leaving the directory
    │   └── DigestMismatchError             the artifact digest differs from the pinned one
    ├── ModelSourceError (ImportError)      model file import / entry point / forward failures
    ├── WeightsMismatchError (ValueError)   missing/unexpected keys, shape or dtype differences
    ├── SelfTestError (RuntimeError)        outputs disagree with eager or the build references
    ├── CaptureError (RuntimeError)         names the shape and the op that broke capture
    ├── DeviceError (RuntimeError)          CUDA asked for where none is, bad device index
    ├── KernelCacheError (RuntimeError)     shipped kernel set unusable (see ``qkan-pack warm``)
    └── InputError (ValueError)             shape/dtype/device outside the manifest; lists
                                            what the artifact accepts

Messages say what went wrong, where (file, key, shape) and how to fix it.
"""

from __future__ import annotations

__all__ = [
    "ArtifactError",
    "CaptureError",
    "DeviceError",
    "DigestMismatchError",
    "IncompatibleArtifactError",
    "InputError",
    "KernelCacheError",
    "ManifestError",
    "ModelSourceError",
    "QkanPackError",
    "SelfTestError",
    "ShapeSpecError",
    "WeightsMismatchError",
]


class QkanPackError(Exception):
    """Root of every error qkan-pack raises on purpose."""


class ShapeSpecError(QkanPackError, ValueError):
    """Shape, dtype or config text that does not parse."""


class ManifestError(QkanPackError, ValueError):
    """A manifest that is not a valid qkan-pack manifest."""


class IncompatibleArtifactError(ManifestError):
    """An artifact this runtime must not load (newer format, unsafe version skew)."""


class ArtifactError(QkanPackError, OSError):
    """The artifact directory on disk does not match its manifest."""


class DigestMismatchError(ArtifactError):
    """The whole-artifact digest differs from the one the caller pinned."""


class ModelSourceError(QkanPackError, ImportError):
    """The model source cannot be imported, built or run."""


class WeightsMismatchError(QkanPackError, ValueError):
    """Weights that do not fit the model exactly."""


class SelfTestError(QkanPackError, RuntimeError):
    """Outputs that disagree with eager execution or the build-time references."""


class CaptureError(QkanPackError, RuntimeError):
    """A CUDA graph that could not be captured under the requested policy."""


class DeviceError(QkanPackError, RuntimeError):
    """A device that does not exist or cannot be used here."""


class KernelCacheError(QkanPackError, RuntimeError):
    """A shipped kernel set that cannot be stored or used."""


class InputError(QkanPackError, ValueError):
    """A predictor input outside what the artifact accepts."""
