"""What a model is, for the people and tools that deploy it: name, version, description,
license, free-form labels (``team=search``), and the class names of a classifier's outputs.

None of it changes how the model runs; all of it is digested with the manifest, so a
registry or a server can show it and trust it as much as the weights. Checked when built
(a usage error) and when read (a manifest error): bounded, printable text only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import ManifestError, ShapeSpecError
from ._json import lone_surrogate

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (docs/ARCHITECTURE.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_TEXT = 1024
MAX_LABELS = 64
MAX_CLASS_LABELS = 100_000
#: A label key as Kubernetes and Docker spell them: letters, digits, ``.``, ``_``, ``-``,
#: ``/``, starting with a letter or digit.
LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}\Z")
#: A model name usable in a URL path (``/v2/models/{name}``) and a file name.
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
DEFAULT_VERSION = "1"


@dataclass(frozen=True)
class Metadata:
    """Name and version (defaults: the model file's stem and ``1``), description, license
    (an SPDX identifier by convention), ``labels`` (key -> text) and ``class_labels`` (a
    classifier's output index -> class name, e.g. from a transformers ``id2label``)."""

    name: str = ""
    version: str = DEFAULT_VERSION
    description: str = ""
    license: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    class_labels: tuple[str, ...] = ()


def check_metadata(*, name: str, version: str, description: str = "", license: str = "",
                   labels: Mapping[str, str] | None = None,
                   class_labels: Sequence[str] = ()) -> Metadata:
    """A ``Metadata`` from what a build was given; ``ShapeSpecError`` naming the option."""
    try:
        return _checked(name, version, description, license, dict(labels or {}),
                        tuple(class_labels), "build")
    except ManifestError as exc:
        raise ShapeSpecError(str(exc)) from None


def metadata_to_dict(metadata: Metadata) -> dict[str, Any]:
    return {"name": metadata.name, "version": metadata.version,
            "description": metadata.description, "license": metadata.license,
            "labels": dict(metadata.labels), "class_labels": list(metadata.class_labels)}


def metadata_from(raw: Any, where: str = "manifest.metadata") -> Metadata:
    """Parse ``manifest.metadata``; absent (older artifacts) reads as the defaults."""
    if raw is None:
        return Metadata()
    if not isinstance(raw, dict):
        raise ManifestError(f"{where} must be a JSON object")
    unknown = set(raw) - {"name", "version", "description", "license", "labels", "class_labels"}
    if unknown:
        raise ManifestError(f"{where} has unknown keys {sorted(unknown)}")
    labels = raw.get("labels", {})
    class_labels = raw.get("class_labels", [])
    if not isinstance(labels, dict) or not isinstance(class_labels, list):
        raise ManifestError(f"{where}.labels must be an object and class_labels a list")
    return _checked(raw.get("name", ""), raw.get("version", DEFAULT_VERSION),
                    raw.get("description", ""), raw.get("license", ""), labels,
                    tuple(class_labels), where)


def _checked(name: Any, version: Any, description: Any, license: Any, labels: dict[Any, Any],
             class_labels: tuple[Any, ...], where: str) -> Metadata:
    texts = {"name": name, "version": version, "description": description, "license": license}
    for key, value in texts.items():
        _check_text(value, f"{where}: {key}")
    if name and not MODEL_NAME.match(name):
        raise ManifestError(f"{where}: name {name!r:.80} must be letters, digits, '.', '_' or "
                            "'-' (at most 128, starting with a letter or digit): it names the "
                            "model in URLs")
    if not version or not MODEL_NAME.match(version):
        raise ManifestError(f"{where}: version {version!r:.80} must be letters, digits, '.', "
                            "'_' or '-' (e.g. 1, 2.0.1)")
    if len(labels) > MAX_LABELS:
        raise ManifestError(f"{where}: {len(labels)} labels; at most {MAX_LABELS}")
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY.match(key):
            raise ManifestError(f"{where}: label key {key!r:.80} must be letters, digits, '.', "
                                "'_', '-' or '/' (at most 63, starting with a letter or digit)")
        _check_text(value, f"{where}: label {key}")
    return Metadata(name=name, version=version, description=description, license=license,
                    labels=dict(sorted(labels.items())),
                    class_labels=check_class_labels(class_labels, where))


def check_class_labels(class_labels: Sequence[Any], where: str) -> tuple[str, ...]:
    """Class names as every reader accepts them (at most ``MAX_CLASS_LABELS``, each text as
    ``_check_text`` says); ``ManifestError`` naming ``where`` and the label. Build checks a
    model's ``config.id2label`` with it, the reader the manifest's."""
    if len(class_labels) > MAX_CLASS_LABELS:
        raise ManifestError(f"{where}: {len(class_labels)} class labels; at most "
                            f"{MAX_CLASS_LABELS}")
    for index, value in enumerate(class_labels):
        _check_text(value, f"{where}: class label {index}")
    return tuple(class_labels)


def _check_text(value: Any, where: str) -> None:
    """Bounded, printable, encodable text: no control characters but newline and tab, and
    no lone surrogate (``'\\udcff'``, what Python makes of a byte that is not UTF-8 in a
    command-line argument), which no UTF-8 writer can encode: serve's ``GET /`` failed on
    one."""
    if not isinstance(value, str):
        raise ManifestError(f"{where} must be text, got {type(value).__name__}")
    if len(value) > MAX_TEXT:
        raise ManifestError(f"{where} is {len(value)} characters; at most {MAX_TEXT}")
    if any((ord(c) < 32 and c not in "\n\t") or ord(c) == 127 for c in value):
        raise ManifestError(f"{where} holds control characters")
    surrogate = lone_surrogate(value)
    if surrogate is not None:
        raise ManifestError(f"{where} is not UTF-8 text: {surrogate}")

