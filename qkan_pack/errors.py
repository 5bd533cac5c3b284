"""The whole qkan-pack error hierarchy.

Every error a user can trigger is a ``QkanPackError``; each also subclasses the builtin
that matches its nature, so ``except ValueError`` keeps working::

    QkanPackError
    ├── ShapeSpecError (ValueError)         bad --shapes / --dtype / --config text
    ├── ManifestError (ValueError)          missing/invalid field, unknown or newer format
    │   └── IncompatibleArtifactError       built for a newer format or an unsafe runtime
    ├── ArtifactError (OSError)             missing/extra file, size or sha256 mismatch,
    │   │                                   symlink, path leaving the directory  [.path]
    │   └── DigestMismatchError             the artifact digest differs from the pinned one
    │                                       [.actual, .expected]
    ├── ModelSourceError (ImportError)      model file import / entry point / forward failures
    ├── WeightsMismatchError (ValueError)   missing/unexpected keys, shape or dtype
    │                                       differences  [.source, .problems]
    ├── SelfTestError (RuntimeError)        outputs disagree with eager or the build references
    │                                       [.shape, .max_abs, .tolerance]
    ├── CaptureError (RuntimeError)         a graph that could not be captured
    │                                       [.shape, .module, .op]
    ├── DeviceError (RuntimeError)          CUDA asked for where none is, bad device index
    ├── KernelCacheError (RuntimeError)     shipped kernel set unusable (see ``qkan-pack warm``)
    ├── BenchError (RuntimeError)           a benchmark that cannot run as asked
    ├── ServeError (RuntimeError)           a server that cannot start or place its replicas
    │                                       [.problem, .hint]
    └── InputError (ValueError)             shape/dtype/device outside the manifest
        │                                   [.accepted: the signatures the artifact takes]
        └── MalformedRequestError           a serve request body that is not the format

Messages are built from the fields; callers branch on the fields, never on the text.
Messages say what went wrong, where (file, key, shape) and how to fix it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ArtifactError",
    "BenchError",
    "CaptureError",
    "DeviceError",
    "DigestMismatchError",
    "IncompatibleArtifactError",
    "InputError",
    "KernelCacheError",
    "MalformedRequestError",
    "ManifestError",
    "ModelSourceError",
    "QkanPackError",
    "SelfTestError",
    "ServeError",
    "ShapeSpecError",
    "WeightsMismatchError",
]


def _restore(cls: type, args: tuple, state: dict[str, Any]) -> QkanPackError:
    error = cls.__new__(cls, *args)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class QkanPackError(Exception):
    """Root of every error qkan-pack raises on purpose."""

    def __reduce__(self) -> tuple:
        # Fields live in __dict__ and constructors take them by keyword: pickle (Ray sends
        # errors between processes) must not call __init__ with the message alone.
        return _restore, (type(self), self.args, dict(self.__dict__))


class ShapeSpecError(QkanPackError, ValueError):
    """Shape, dtype or config text that does not parse."""


class ManifestError(QkanPackError, ValueError):
    """A manifest that is not a valid qkan-pack manifest."""


class IncompatibleArtifactError(ManifestError):
    """An artifact this runtime must not load (newer format, unsafe version skew)."""


class ArtifactError(QkanPackError, OSError):
    """The artifact directory on disk does not match its manifest (``path``: where)."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class DigestMismatchError(ArtifactError):
    """The whole-artifact digest differs from the one the caller pinned."""

    def __init__(self, *, path: str, actual: str, expected: str) -> None:
        super().__init__(
            f"artifact {path} has digest {actual}, but {expected} was pinned: the artifact "
            "changed since the digest was taken; refusing to load it", path=path)
        self.actual = actual
        self.expected = expected


class ModelSourceError(QkanPackError, ImportError):
    """The model source cannot be imported, built or run."""


class WeightsMismatchError(QkanPackError, ValueError):
    """Weights that do not fit the model exactly; ``problems`` lists every key that does not."""

    def __init__(self, *, source: str, problems: Sequence[str] = (), reason: str = "") -> None:
        self.source = source
        self.problems = tuple(problems)
        if self.problems:
            message = f"weights from {source} do not fit the model:\n  " + "\n  ".join(self.problems)
        else:
            message = f"weights from {source}: {reason}"
        super().__init__(message)


class SelfTestError(QkanPackError, RuntimeError):
    """Outputs that disagree with eager execution or the build-time references."""

    def __init__(self, *, shape: str, compared: str, max_abs: float,
                 tolerance: tuple[float, float], hint: str) -> None:
        self.shape = shape
        self.compared = compared
        self.max_abs = max_abs
        self.tolerance = tuple(tolerance)
        rtol, atol = self.tolerance
        super().__init__(
            f"self-test failed for shape {shape}: {compared} differ by up to {max_abs:.3g} "
            f"(rtol={rtol:g}, atol={atol:g}). {hint}"
        )


class CaptureError(QkanPackError, RuntimeError):
    """A CUDA graph that could not be captured under the requested policy.

    ``shape`` is the manifest shape, ``module`` the submodule path (None for the whole
    model), ``op`` what broke the capture (an exception summary or an aten op).
    """

    def __init__(self, op: str, *, shape: str | None = None, module: str | None = None,
                 hint: str = "") -> None:
        self.op = op
        self.shape = shape
        self.module = module
        self.hint = hint
        where = []
        if module is not None:
            where.append(f"submodule {module}")
        if shape is not None:
            where.append(f"shape {shape}")
        prefix = f"capture failed for {' '.join(where)}: " if where else ""
        super().__init__(prefix + op + (f". {hint}" if hint else ""))


class DeviceError(QkanPackError, RuntimeError):
    """A device that does not exist or cannot be used here."""


class KernelCacheError(QkanPackError, RuntimeError):
    """A shipped kernel set that cannot be stored or used."""


class BenchError(QkanPackError, RuntimeError):
    """A benchmark that cannot run as asked (bad settings, missing plotting library)."""


class ServeError(QkanPackError, RuntimeError):
    """``qkan-pack serve`` cannot start as asked: a taken port, replicas the cluster cannot
    place, replicas that failed to load."""

    def __init__(self, problem: str, *, hint: str = "") -> None:
        self.problem = problem
        self.hint = hint
        super().__init__(problem + (f"; {hint}" if hint else ""))


class InputError(QkanPackError, ValueError):
    """A predictor input outside what the artifact accepts.

    ``accepted`` lists the input signatures the artifact takes, each a mapping of input
    name to ``(shape, dtype)``; the message shows them, callers read the data.
    """

    def __init__(self, problem: str, *,
                 accepted: Sequence[Mapping[str, tuple[tuple[int, ...], str]]] = (),
                 padded: bool = False) -> None:
        self.problem = problem
        self.accepted = tuple(accepted)
        self.padded = padded
        message = problem
        if self.accepted:
            message += f"; accepted: {format_accepted(self.accepted, padded=padded)}"
        super().__init__(message)


class MalformedRequestError(InputError):
    """A serve request body that is not the request format at all (HTTP 400, unlike 422)."""


def format_accepted(accepted: Sequence[Mapping[str, tuple[tuple[int, ...], str]]], *,
                    padded: bool = False) -> str:
    """Accepted signatures as one line: ``1x2 float32 | 64x2 float32`` (names shown when an
    artifact takes several inputs)."""
    def one(signature: Mapping[str, tuple[tuple[int, ...], str]]) -> str:
        parts = [f"{'x'.join(map(str, shape))} {dtype}" for shape, dtype in signature.values()]
        if len(signature) == 1:
            return parts[0]
        return ", ".join(f"{name}: {part}" for name, part in zip(signature, parts))

    text = " | ".join(one(signature) for signature in accepted)
    return text + (" (smaller batches padded)" if padded else "")
