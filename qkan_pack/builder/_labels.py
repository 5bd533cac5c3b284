"""A classifier's class labels, taken from its model at build.

A transformers classifier names its classes in ``config.id2label``; the artifact records
them as ``metadata.class_labels``, and ``predict`` names the top class of each row with
them. Both go wrong quietly when the labels are not the model's: the reader refuses text a
manifest may not hold, and a count that no output has names nothing (or, worse, names the
wrong axis). Both are refused here, at build, where the model's config can still be fixed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import torch

from ..errors import ManifestError
from ..format import MAX_MANIFEST_BYTES, ShapeEntry, check_class_labels, format_shape

#: Where the labels come from, as a refusal names it.
SOURCE = "the model's config.id2label"


def class_labels_of(model: torch.nn.Module) -> tuple[str, ...]:
    """A transformers classifier's class names, index order (``config.id2label``); none when
    the config has only the library's placeholders (``LABEL_0``...)."""
    id2label = getattr(getattr(model, "config", None), "id2label", None)
    if not isinstance(id2label, Mapping) or not id2label:
        return ()
    try:
        ordered = [str(id2label[i]) for i in range(len(id2label))]
    except KeyError:
        return ()
    if ordered == [f"LABEL_{i}" for i in range(len(ordered))]:
        return ()
    return tuple(ordered)


def unread_labels_notes(model: torch.nn.Module) -> list[str]:
    """Said at build when ``config.id2label`` is there but not read: its keys are not the
    class indices 0..N-1 (transformers makes them so; a hand-made config may not)."""
    id2label = getattr(getattr(model, "config", None), "id2label", None)
    if not isinstance(id2label, Mapping) or not id2label:
        return []
    if set(id2label) == set(range(len(id2label))):
        return []
    keys = ", ".join(repr(key) for key in list(id2label)[:5])
    return [f"{SOURCE} is not recorded as class labels: its keys ({keys}"
            f"{', ...' if len(id2label) > 5 else ''}) are not the class indices 0.."
            f"{len(id2label) - 1}; key it by the integer index of each class"]


def checked_class_labels(model: torch.nn.Module) -> tuple[str, ...]:
    """``class_labels_of``, checked as every metadata text is (``format.check_class_labels``)
    before the model runs: a manifest the reader refuses is never written. Labels that alone
    exceed the manifest's size limit are refused here too, rather than after every
    reference has run (the writer checks the whole manifest: ``readable_manifest``)."""
    try:
        labels = check_class_labels(class_labels_of(model), SOURCE)
        size = len(json.dumps(labels))
        if size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{SOURCE}: its {len(labels)} class labels take {size} bytes, "
                                f"more than the {MAX_MANIFEST_BYTES} bytes a whole manifest "
                                "may take")
    except ManifestError as exc:
        raise ManifestError(f"{exc}; the artifact records these as its class labels: fix "
                            "id2label in the model's config") from None
    return labels


def check_labels_fit(labels: Sequence[str], entries: Sequence[ShapeEntry]) -> None:
    """Refuse class labels that no output of the model has room for.

    Labels name the classes along a classifier output's last dimension (``predict`` reads
    them so: the output ``logits`` of shape ``(batch, 10)`` has 10 classes). A model with
    several outputs (a ModelOutput's ``logits`` beside ``hidden_states``) needs one of them
    whose last dimension is the number of labels at every declared shape; the others are not
    classified. No such output (1000 labels on a model of 10 outputs, 3 on one of 10) is a
    ``ManifestError`` naming both counts and the outputs' last dimensions."""
    if not labels:
        return
    fitting = [name for name in entries[0].outputs.leaf_names()
               if all(_last_dimensions(entry).get(name) == len(labels) for entry in entries)]
    if fitting:
        return
    first = entries[0]
    described = ", ".join(f"{name} {format_shape(spec.shape)}" for name, spec in
                          zip(first.outputs.leaf_names(), first.outputs.leaves()))
    raise ManifestError(
        f"{SOURCE} has {len(labels)} class labels, but no output has {len(labels)} values "
        f"along its last dimension at every declared shape (at {first.label}: "
        f"{described or 'no tensor output'}); class labels name a classifier output's "
        "classes, one per index of its last dimension: make id2label (and num_labels) match "
        "the model's classifier, or drop it from the model's config")


def _last_dimensions(entry: ShapeEntry) -> dict[str, int | None]:
    """Each tensor output's last dimension at one declared entry (None for a scalar)."""
    return {name: spec.shape[-1] if spec.shape else None
            for name, spec in zip(entry.outputs.leaf_names(), entry.outputs.leaves())}
