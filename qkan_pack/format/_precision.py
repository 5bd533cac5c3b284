"""Reduced precision as the manifest records it (``build --precision``): the policy build
gated (the default, the allowed precisions, the error bound every load holds them to) and,
per kind of device, what ``warm --precision auto`` measured and chose; the rules between a
policy's choices and the manifest's shapes (``check_choices``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import ManifestError
from ._constants import MAX_MAX_ERROR, PRECISIONS
from ._schema import (
    WHEN_DEFAULT,
    Choice,
    ListOf,
    MapOf,
    Nested,
    Number,
    Text,
    json_field,
    key_path,
    refuse,
    show,
)

PRECISION = Choice(PRECISIONS)
_TEXT = Text()
_TEXTS = MapOf(_TEXT)

_FIGURES = MapOf(ListOf(Number(low=0)), key=PRECISION)


@dataclass(frozen=True)
class PrecisionChoice:
    """What ``qkan-pack warm --precision auto`` measured on one kind of device (``key``:
    ``runtime.precision_key``) and the precision it chose there: per precision timed, each
    shape's median call latency (microseconds) and measured error (share of the outputs'
    scale against the float32 references), in manifest order; ``refused``: the precisions
    that did not run there, and why. ``shapes``: the precision each shape runs, in manifest
    order (each shape is its own graph, so a launch-bound batch of one may stay float32
    where a large batch gains from bfloat16); empty: every shape runs ``precision``, the
    choice over all shapes."""

    key: str = json_field(_TEXT)
    precision: str = json_field(PRECISION)
    details: Mapping[str, str] = json_field(_TEXTS, factory=dict)
    latency_us: Mapping[str, tuple[float, ...]] = json_field(_FIGURES, factory=dict)
    error: Mapping[str, tuple[float, ...]] = json_field(_FIGURES, factory=dict)
    refused: Mapping[str, str] = json_field(MapOf(_TEXT, key=PRECISION), factory=dict)
    shapes: tuple[str, ...] = json_field(ListOf(PRECISION), default=(), omit=WHEN_DEFAULT)

    def for_shape(self, index: int) -> str:
        """The precision manifest shape ``index`` runs on this kind of device."""
        return self.shapes[index] if self.shapes else self.precision

    def mean_latency_us(self, precision: str) -> float:
        """``precision``'s latency over the shapes: their geometric mean (``geometric_mean``)."""
        return geometric_mean(self.latency_us[precision])


def geometric_mean(values: Sequence[float]) -> float:
    """The geometric mean of per-shape latencies: every shape weighs alike whatever its size
    (what ``warm --precision auto`` compares precisions by)."""
    if not values:
        return math.inf
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


@dataclass(frozen=True)
class PrecisionPolicy:
    """The reduced precision an artifact may compute in (``build --precision``).

    ``default`` runs where no choice names the loading device (float32 for ``--precision
    auto``); ``allowed`` are the precisions build gated (float32 always among them), which a
    load may be asked for and ``warm --precision auto`` chooses among; ``max_error`` bounds
    every one of them at every load, on the loading device (a share of each output's scale).
    """

    default: str = json_field(PRECISION)
    max_error: float = json_field(Number())
    allowed: tuple[str, ...] = json_field(ListOf(PRECISION))
    choices: tuple[PrecisionChoice, ...] = json_field(
        ListOf(Nested(PrecisionChoice), unique=(lambda choice: choice.key, "device key")),
        default=())

    def __post_init__(self) -> None:
        if len(set(self.allowed)) != len(self.allowed) or "fp32" not in self.allowed:
            raise ManifestError(f"must list fp32 and each precision once, got "
                                f"{show(list(self.allowed))}", where="allowed")
        if self.default not in self.allowed:
            raise ManifestError(f"must be among the allowed precisions "
                                f"{', '.join(self.allowed)}, got {show(self.default)}",
                                where="default")
        if not 0 < self.max_error <= MAX_MAX_ERROR:  # NaN too
            raise ManifestError(f"must be in (0, {MAX_MAX_ERROR:g}], got "
                                f"{show(self.max_error)}", where="max_error")

    def choice(self, key: str) -> PrecisionChoice | None:
        """The choice recorded for device ``key``, if any."""
        return next((c for c in self.choices if c.key == key), None)


def check_choices(policy: PrecisionPolicy, shapes: int, where: str) -> None:
    """Each choice names allowed precisions, with figures for every shape of each precision
    timed."""
    allowed = policy.allowed
    among = ", ".join(allowed)
    for index, choice in enumerate(policy.choices):
        here = f"{where}.choices[{index}]"
        if choice.precision not in allowed:
            refuse(f"{here}.precision", f"must be one of the allowed precisions {among}, got "
                                        f"{show(choice.precision)}")
        for table in ("latency_us", "error"):
            for key, values in getattr(choice, table).items():
                if key not in allowed or len(values) != shapes:
                    refuse(key_path(f"{here}.{table}", key), f"must be {shapes} non-negative "
                           f"numbers (one per shape) of an allowed precision ({among})")
        if choice.shapes and (len(choice.shapes) != shapes
                              or not all(p in allowed for p in choice.shapes)):
            refuse(f"{here}.shapes", f"must name one allowed precision per shape ({shapes}), "
                                     f"among {among}")
