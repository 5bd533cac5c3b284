"""Reduced precision as the manifest records it (``build --precision``): the policy build
gated (the default, the allowed precisions, the layouts its graphs may be captured in, the
error bound every load holds them to) and, per kind of device, what ``warm --precision
auto`` measured and chose (a precision and a layout, for the artifact or per shape); the
rules between a policy's choices and the manifest's shapes (``check_choices``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import ManifestError
from ._constants import CHANNELS_LAST, CONTIGUOUS, LAYOUTS, MAX_MAX_ERROR, PRECISIONS
from ._schema import (
    WHEN_DEFAULT,
    Choice,
    ListOf,
    MapOf,
    Nested,
    Nullable,
    Number,
    Text,
    json_field,
    key_path,
    refuse,
    show,
)

PRECISION = Choice(PRECISIONS)
LAYOUT = Choice(LAYOUTS)
#: The format version the layout keys came with (``precision.layouts``, and a choice's
#: ``layout``, ``shape_layouts``, ``channels_last``).
LAYOUTS_SINCE = 3
_TEXT = Text()
_TEXTS = MapOf(_TEXT)

_FIGURES = MapOf(ListOf(Number(low=0)), key=PRECISION)
_REFUSED = MapOf(_TEXT, key=PRECISION)
#: One (precision, layout) pair ``warm --precision auto`` times and chooses among.
Candidate = tuple[str, str]


@dataclass(frozen=True)
class LayoutFigures:
    """What ``warm --precision auto`` measured with graphs captured channels-last: per
    precision timed, each shape's median call latency (microseconds) and measured error, in
    manifest order; ``refused``: the precisions that did not load channels-last there, and
    why. (The choice's own ``latency_us``, ``error`` and ``refused`` are the contiguous
    layout's, as in artifacts from before layouts were chosen.)"""

    latency_us: Mapping[str, tuple[float, ...]] = json_field(_FIGURES, factory=dict)
    error: Mapping[str, tuple[float, ...]] = json_field(_FIGURES, factory=dict)
    refused: Mapping[str, str] = json_field(_REFUSED, factory=dict)


@dataclass(frozen=True)
class PrecisionChoice:
    """What ``qkan-pack warm --precision auto`` measured on one kind of device (``key``:
    ``runtime.precision_key``) and the precision it chose there: per precision timed, each
    shape's median call latency (microseconds) and measured error (share of the outputs'
    scale against the float32 references), in manifest order; ``refused``: the precisions
    that did not run there, and why. ``shapes``: the precision each shape runs, in manifest
    order (each shape is its own graph, so a launch-bound batch of one may stay float32
    where a large batch gains from bfloat16); empty: every shape runs ``precision``, the
    choice over all shapes. ``layout``, ``shape_layouts``: the same for the layout its
    graphs are captured in (``contiguous`` unless ``channels_last`` was timed faster);
    ``channels_last``: the figures of the channels-last graphs, where they were timed."""

    key: str = json_field(_TEXT)
    precision: str = json_field(PRECISION)
    details: Mapping[str, str] = json_field(_TEXTS, factory=dict)
    latency_us: Mapping[str, tuple[float, ...]] = json_field(_FIGURES, factory=dict)
    error: Mapping[str, tuple[float, ...]] = json_field(_FIGURES, factory=dict)
    refused: Mapping[str, str] = json_field(_REFUSED, factory=dict)
    shapes: tuple[str, ...] = json_field(ListOf(PRECISION), default=(), omit=WHEN_DEFAULT)
    layout: str = json_field(LAYOUT, default=CONTIGUOUS, omit=WHEN_DEFAULT, since=LAYOUTS_SINCE)
    shape_layouts: tuple[str, ...] = json_field(ListOf(LAYOUT), default=(), omit=WHEN_DEFAULT,
                                                since=LAYOUTS_SINCE)
    channels_last: LayoutFigures | None = json_field(Nullable(Nested(LayoutFigures)),
                                                     default=None, omit=WHEN_DEFAULT,
                                                     since=LAYOUTS_SINCE)

    def for_shape(self, index: int) -> str:
        """The precision manifest shape ``index`` runs on this kind of device."""
        return self.shapes[index] if self.shapes else self.precision

    def layout_for_shape(self, index: int) -> str:
        """The layout manifest shape ``index``'s graph is captured in on this kind of device."""
        return self.shape_layouts[index] if self.shape_layouts else self.layout

    @property
    def per_shape(self) -> bool:
        """Whether shapes differ in precision or layout (else the whole choice applies)."""
        return bool(self.shapes or self.shape_layouts)

    def named_shapes(self) -> list[str]:
        """Each shape's precision, with its layout where channels-last (``candidate_name``),
        in manifest order; empty where every shape runs the whole choice."""
        count = max(len(self.shapes), len(self.shape_layouts))
        return [candidate_name(self.for_shape(i), self.layout_for_shape(i)) for i in range(count)]

    def mean_latency_us(self, precision: str, layout: str = CONTIGUOUS) -> float:
        """``precision``'s latency over the shapes in ``layout``: their geometric mean
        (``geometric_mean``)."""
        return geometric_mean(self.figures()[precision, layout][0])

    def figures(self) -> dict[Candidate, tuple[tuple[float, ...], tuple[float, ...] | None]]:
        """Every (precision, layout) timed: its per-shape latencies and measured errors
        (None for float32, held to no bound), contiguous first."""
        found: dict[Candidate, tuple[tuple[float, ...], tuple[float, ...] | None]] = {}
        layouts = [(CONTIGUOUS, self.latency_us, self.error)]
        if self.channels_last is not None:
            layouts.append((CHANNELS_LAST, self.channels_last.latency_us,
                            self.channels_last.error))
        for layout, latency, error in layouts:
            for precision, times in latency.items():
                found[precision, layout] = (times, error.get(precision))
        return found

    def refusals(self) -> dict[Candidate, str]:
        """Every (precision, layout) that did not load, and why; contiguous first."""
        found = {(precision, CONTIGUOUS): why for precision, why in self.refused.items()}
        if self.channels_last is not None:
            found.update({(precision, CHANNELS_LAST): why
                          for precision, why in self.channels_last.refused.items()})
        return found


def candidate_name(precision: str, layout: str = CONTIGUOUS) -> str:
    """How reports name a precision's graphs in a layout: ``bf16``, ``bf16 channels-last``."""
    return precision + (" channels-last" if layout == CHANNELS_LAST else "")


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
    ``layouts``: the layouts a load may capture graphs in, ``contiguous`` first; build adds
    ``channels_last`` for a model with a 2-D convolution (``runtime.channels_last_applies``),
    and ``warm --precision auto`` then times each allowed precision in both.
    """

    default: str = json_field(PRECISION)
    max_error: float = json_field(Number())
    allowed: tuple[str, ...] = json_field(ListOf(PRECISION))
    choices: tuple[PrecisionChoice, ...] = json_field(
        ListOf(Nested(PrecisionChoice), unique=(lambda choice: choice.key, "device key")),
        default=())
    layouts: tuple[str, ...] = json_field(ListOf(LAYOUT), default=(CONTIGUOUS,),
                                          omit=WHEN_DEFAULT, since=LAYOUTS_SINCE)

    _json_order = ("default", "max_error", "allowed", "layouts", "choices")

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
        if self.layouts[:1] != (CONTIGUOUS,) or len(set(self.layouts)) != len(self.layouts):
            raise ManifestError(f"must list {CONTIGUOUS} first and each layout once, got "
                                f"{show(list(self.layouts))}", where="layouts")

    def choice(self, key: str) -> PrecisionChoice | None:
        """The choice recorded for device ``key``, if any."""
        return next((c for c in self.choices if c.key == key), None)


def check_choices(policy: PrecisionPolicy, shapes: int, where: str) -> None:
    """Each choice names allowed precisions and layouts, with figures for every shape of
    each precision timed."""
    allowed = policy.allowed
    among = ", ".join(allowed)
    for index, choice in enumerate(policy.choices):
        here = f"{where}.choices[{index}]"
        if choice.precision not in allowed:
            refuse(f"{here}.precision", f"must be one of the allowed precisions {among}, got "
                                        f"{show(choice.precision)}")
        _check_figures(choice, allowed, shapes, here)
        if choice.channels_last is not None:
            if CHANNELS_LAST not in policy.layouts:
                refuse(f"{here}.channels_last", _NOT_LISTED.format(CHANNELS_LAST, where))
            _check_figures(choice.channels_last, allowed, shapes, f"{here}.channels_last")
        if choice.shapes and (len(choice.shapes) != shapes
                              or not all(p in allowed for p in choice.shapes)):
            refuse(f"{here}.shapes", f"must name one allowed precision per shape ({shapes}), "
                                     f"among {among}")
        if choice.layout not in policy.layouts:
            refuse(f"{here}.layout", _NOT_LISTED.format(choice.layout, where))
        if choice.shape_layouts and (len(choice.shape_layouts) != shapes or not all(
                layout in policy.layouts for layout in choice.shape_layouts)):
            refuse(f"{here}.shape_layouts", f"must name one layout per shape ({shapes}), among "
                                            f"{where}.layouts ({', '.join(policy.layouts)})")


_NOT_LISTED = "names the layout {} that {}.layouts does not list"


def _check_figures(figures: PrecisionChoice | LayoutFigures, allowed: Sequence[str],
                   shapes: int, here: str) -> None:
    """Latencies and errors of allowed precisions, one per shape."""
    for table in ("latency_us", "error"):
        for key, values in getattr(figures, table).items():
            if key not in allowed or len(values) != shapes:
                refuse(key_path(f"{here}.{table}", key), f"must be {shapes} non-negative "
                       f"numbers (one per shape) of an allowed precision ({', '.join(allowed)})")
