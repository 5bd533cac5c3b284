"""What a load did: per-shape records and the ``LoadReport`` behind ``predictor.report``."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from ..format import CHANNELS_LAST, CONTIGUOUS, candidate_name

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["LoadReport"]



@contextmanager
def timed_stage(stages: dict[str, float] | None, name: str) -> Iterator[None]:
    """Add the seconds the block takes to ``stages[name]`` (nothing when ``stages`` is None)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        if stages is not None:
            stages[name] = stages.get(name, 0.0) + time.perf_counter() - started


@dataclass
class ShapeRecord:
    """What happened to one manifest shape at load."""

    label: str
    policy: str = "eager"
    capture_seconds: float = 0.0
    pool_bytes: int = 0
    fallback_reason: str = ""
    graphs: int = 0
    replay_max_abs: float = 0.0
    reference_max_abs: float = 0.0
    #: ``(rtol, atol)`` the reference self-test held this shape to (``check_reference``).
    reference_tolerance: tuple[float, float] | None = None


@dataclass
class PrecisionRecord:
    """The precision a load runs (``fp32``, ``tf32``, ``bf16``, ``fp16``) and the layout its
    graphs are captured in (``contiguous``, ``channels_last``: ``runtime._layout``), why
    those (``source``), the artifact's ``max_error``, and per shape the error measured here
    against the float32 references (a share of the outputs' scale) beside what build
    measured."""

    precision: str = "fp32"
    source: str = "built in float32"
    max_error: float | None = None
    errors: dict[str, float] = field(default_factory=dict)
    build_errors: dict[str, float | None] = field(default_factory=dict)
    #: Per shape label, the precision it runs where shapes differ (``warm --precision auto``
    #: chose per shape); empty: every shape runs ``precision``.
    shapes: dict[str, str] = field(default_factory=dict)
    layout: str = CONTIGUOUS
    #: Per shape label, the layout it runs where shapes differ; empty: every shape ``layout``.
    layouts: dict[str, str] = field(default_factory=dict)

    def of(self, label: str) -> str:
        """The precision shape ``label`` runs."""
        return self.shapes.get(label, self.precision)

    def layout_of(self, label: str) -> str:
        """The layout shape ``label``'s graph is captured in."""
        return self.layouts.get(label, self.layout)

    @property
    def reduced(self) -> bool:
        """Whether any shape runs below full float32."""
        return self.precision != "fp32" or any(p != "fp32" for p in self.shapes.values())

    @property
    def gated(self) -> bool:
        """Whether any shape computes otherwise than the float32 forward (a reduced precision
        or channels-last graphs): the load then holds it to ``max_error`` (the gate)."""
        return self.reduced or CHANNELS_LAST in (self.layout, *self.layouts.values())

    def named(self, label: str | None = None) -> str:
        """A shape's (or the load's) precision, with its layout where channels-last."""
        if label is None:
            return candidate_name(self.precision, self.layout)
        return candidate_name(self.of(label), self.layout_of(label))

    def __str__(self) -> str:
        text = f"precision {self.named()} ({self.source})"
        if self.shapes or self.layouts:
            text = "precision per shape " + ", ".join(
                f"{label} {self.named(label)}" for label in {**self.shapes, **self.layouts}
            ) + f" ({self.source})"
        if self.max_error is not None:
            text += f"; max error {self.max_error:.2g}"
        if self.errors:
            text += "; measured here " + ", ".join(
                f"{label} {error:.2g}" + ("" if self.build_errors.get(label) is None
                                          else f" (build {self.build_errors[label]:.2g})")
                for label, error in self.errors.items())
        return text


@dataclass
class LoadReport:
    """What ``Predictor.load`` did, how long each stage took, and how well outputs agreed."""

    artifact: str
    digest: str
    device: str
    capture_policy: str
    factory_device: str | None
    config: dict[str, Any]
    config_overrides: dict[str, Any]
    reference_tolerance: tuple[float, float]
    solvers: list[str] = field(default_factory=list)
    shapes: list[ShapeRecord] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)
    load_to_ready_seconds: float = 0.0
    pool_bytes: int = 0
    kernel_cache: str = "not used"
    #: The cache files of kernels compiled at load although a shipped set was used
    #: (``KernelUse.files``), as a set ships them: what ``warm`` adds to the set.
    kernels_compiled: dict[str, bytes] = field(default_factory=dict, repr=False)
    compiled: str = "off"
    #: Declared padding (``build --pad``): the pad values and each axis with its sizes.
    padding: list[str] = field(default_factory=list)
    #: The precision this load runs and its measured error (``runtime._precision``).
    precision: PrecisionRecord = field(default_factory=PrecisionRecord)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (the compiled kernels' bytes left out: the
        ``kernel_cache`` line and the warning name them)."""
        data = asdict(self)
        del data["kernels_compiled"]
        return data

    def warn(self, message: str) -> None:
        """Record a warning in the report and emit it as a Python warning."""
        self.warnings.append(message)
        warnings.warn(message, stacklevel=3)

    def stage(self, name: str) -> AbstractContextManager[None]:
        """Time a load stage (repeated stages add up)."""
        return timed_stage(self.stages, name)

    def __str__(self) -> str:
        width = max([18, *(len(r.label) + 2 for r in self.shapes)])  # named inputs: long labels
        lines = [
            f"artifact {self.artifact} ({self.digest[:19]}…) on {self.device}",
            "; ".join([f"policy {self.capture_policy}",
                       *([f"solvers {', '.join(self.solvers)}"] if self.solvers else []),
                       *([f"factory device {self.factory_device}"] if self.factory_device else []),
                       *([f"overrides {self.config_overrides}"] if self.config_overrides else [])]),
            f"{'shape':<{width}}{'policy':<12}{'capture s':>10}{'pool MiB':>10}{'replay err':>12}"
            f"{'ref err':>12}{'ref bound':>20}",
        ]
        for r in self.shapes:
            lines.append(
                f"{r.label:<{width}}{r.policy:<12}{r.capture_seconds:>10.3f}"
                f"{r.pool_bytes / 2**20:>10.2f}{r.replay_max_abs:>12.2e}{r.reference_max_abs:>12.2e}"
                f"{_bound_text(r.reference_tolerance):>20}"
            )
        stages = ", ".join(f"{k} {v:.3f}s" for k, v in self.stages.items())
        lines.append(f"ready in {self.load_to_ready_seconds:.3f}s ({stages})")
        lines.append(f"kernel cache: {self.kernel_cache}")
        if self.padding:
            lines.append("padding: " + "; ".join(self.padding))
        if self.compiled != "off":
            lines.append(f"compiled mode: {self.compiled}")
        if self.precision.gated or self.precision.max_error is not None:
            lines.append(str(self.precision))
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)


def _bound_text(tolerance: tuple[float, float] | None) -> str:
    """A shape's reference ``(rtol, atol)`` as the table shows it (atol in units of the
    output's scale)."""
    return "-" if tolerance is None else f"({tolerance[0]:.2g}, {tolerance[1]:.2g})"
