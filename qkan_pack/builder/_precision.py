"""Reduced precision on the build side: the gate at build, and the choice per device.

The gate (``gate_precision``): the model's outputs at the declared precision, on the
reference inputs and the ``--calibration`` inputs, against its float32 outputs, each output's
largest difference as a share of its scale; beyond ``max_error`` build refuses
(``PrecisionError``, the figures per output) and writes nothing. The figures are recorded per
shape: they are the build host's (a CPU: its autocast keeps fewer ops in float32 than CUDA's,
and it has no TF32, which build therefore cannot measure), so every load measures again on
its own device against the same bound.

The choice (``choose_precision``, ``qkan-pack warm --precision auto``): every precision the
build allowed is loaded on the device in every layout the build listed (channels-last too
for a model with a 2-D convolution), gated there as any load is, and timed per shape; the
fastest (precision, layout) is recorded for the device's kind (``runtime.precision_key``),
for the artifact and per shape, with the figures.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from ..errors import InputFileError, OptionError, PrecisionError, QkanPackError
from ..format import (
    AUTO_PRECISION,
    CHANNELS_LAST,
    CONTIGUOUS,
    DEFAULT_MAX_ERROR,
    LAYOUTS,
    MAX_MAX_ERROR,
    PRECISIONS,
    LayoutFigures,
    Manifest,
    PrecisionChoice,
    PrecisionPolicy,
    ShapeEntry,
    geometric_mean,
)
from ..runtime import (
    ChannelPool,
    Predictor,
    describe,
    flatten,
    latencies,
    output_errors,
    precision_key,
    precision_unavailable,
    read_artifact,
    reference_samples,
    resolve_device,
    served_forward,
)
from ._writer import locked_target, write_artifact

#: A timer: seconds per call of ``call`` (a ``TimedCall``: it names the precision and shape
#: it runs; ``sync`` waits for its result), e.g. a median.
Timer = Callable[["TimedCall", Callable[[], None]], float]
#: Precisions within this share of the fastest one count as equally fast: the most precise
#: of them is chosen (timing noise must not trade accuracy for nothing).
SPEED_MARGIN = 0.03
#: The default timer's untimed and timed calls per shape.
WARMUP_CALLS, TIMED_CALLS = 10, 100
#: Where build computes (``runtime._load.BUILD_DEVICE_TYPE``), as figures name it.
BUILD_HOST = "cpu (build host)"
#: Ordered most precise first: ties go to the first.
_ORDER = ("fp32", "tf32", "fp16", "bf16")
#: What the choice ranks: a precision (contiguous graphs) or a (precision, layout) pair.
_Key = TypeVar("_Key", str, tuple[str, str])


def check_precision_options(precision: Any, max_error: Any) -> tuple[str, float | None]:
    """``build(precision=..., max_error=...)`` checked: a known precision or ``auto``, and a
    ``max_error`` in (0, ``MAX_MAX_ERROR``] for a reduced one (``DEFAULT_MAX_ERROR`` when
    None), none for float32."""
    choices = (*PRECISIONS, AUTO_PRECISION)
    if precision not in choices:
        raise OptionError(option="precision", value=precision,
                          expected=f"one of {', '.join(choices)}")
    if precision == "fp32":
        if max_error is not None:
            raise OptionError(option="max_error", value=max_error,
                              expected="no value with precision fp32 (the bound of a reduced "
                                       "precision: pass --precision bf16, fp16, tf32 or auto)")
        return precision, None
    if max_error is None:
        return precision, DEFAULT_MAX_ERROR
    valid = isinstance(max_error, (int, float)) and not isinstance(max_error, bool) \
        and math.isfinite(max_error) and 0 < max_error <= MAX_MAX_ERROR
    if not valid:
        raise OptionError(option="max_error", value=max_error,
                          expected=f"a share of each output's scale in (0, {MAX_MAX_ERROR:g}], "
                                   "e.g. 1e-2")
    return precision, float(max_error)


@dataclasses.dataclass(frozen=True)
class GateSample:
    """Inputs build measures a precision on, the entry they fit and the float32 outputs."""

    entry: int
    inputs: list[torch.Tensor]
    want: list[torch.Tensor]


class CalibrationSample:
    """A ``--calibration`` sample: its float32 outputs are computed each time it is measured
    and dropped after, never held for all samples at once (a small file may hold many inputs
    of large outputs); the model failing on it is the file's problem, named as such."""

    def __init__(self, entry: int, inputs: list[torch.Tensor],
                 reference: Callable[[], list[torch.Tensor]], where: str) -> None:
        self.entry, self.inputs = entry, inputs
        self._reference, self.where = reference, where

    @property
    def want(self) -> list[torch.Tensor]:
        try:
            return self._reference()
        except QkanPackError as exc:
            raise InputFileError(path=self.where, problem=(
                f"the model cannot run on this sample ({exc}); calibration inputs must be "
                "values the model takes: finite floats, token ids within the embedding's "
                "rows")) from exc


def gate_precision(forward: Callable[..., Any], entries: Sequence[ShapeEntry],
                   samples: Sequence[GateSample | CalibrationSample], precision: str,
                   max_error: float, *, channels_last: bool = False,
                   pools: Sequence[ChannelPool] = ()
                   ) -> tuple[PrecisionPolicy, list[ShapeEntry], list[str]]:
    """Measure ``precision`` (or, for ``auto``, each reduced precision) on ``samples``;
    return the policy to record, the entries with their figures, and notes. An explicit
    precision beyond ``max_error`` is refused (``PrecisionError``); under ``auto`` it is
    left out of the allowed ones, with a note. With ``channels_last`` (the model has a 2-D
    convolution), the channels-last layout is listed if the forward runs on channels-last
    inputs within ``max_error`` here, in float32 (``_channels_last_refusal``; a layout
    changes which kernel computes, not the arithmetic: every load gates the precision and
    layout it captures in). ``pools``: per entry, its outputs' channel scales
    (``output_errors``)."""
    _refuse_half_models(entries, precision)
    calibrated = any(isinstance(sample, CalibrationSample) for sample in samples)
    if precision == "tf32" and calibrated:
        raise OptionError(option="calibration", value="(a file)", expected=(
            "no --calibration with --precision tf32: build measures on its CPU, which has no "
            "TF32, and loads measure the references only; gate tf32 on a GPU with "
            "`qkan-pack verify --precision tf32`, or build --precision auto"))
    candidates = [p for p in PRECISIONS if p != "fp32"] if precision == AUTO_PRECISION \
        else [precision]
    measured: dict[str, list[float | None]] = {}
    notes, allowed = [], ["fp32"]
    for candidate in candidates:
        try:
            per_entry, figures = _measure(forward, entries, samples, candidate, max_error,
                                          pools=pools)
        except PrecisionError as exc:  # the forward cannot run in it here
            if precision != AUTO_PRECISION:
                raise
            notes.append(f"--precision auto: {candidate} left out ({exc.problem or exc})")
            continue
        if figures and precision != AUTO_PRECISION:
            raise PrecisionError(precision=candidate, device=BUILD_HOST, max_error=max_error,
                                 figures=figures, hint=_build_hint(candidate, figures))
        if figures:
            beyond = PrecisionError(precision=candidate, device=BUILD_HOST, max_error=max_error,
                                    figures=figures)
            notes.append(f"--precision auto: {candidate} left out ({beyond})")
            continue
        measured[candidate] = per_entry
        allowed.append(candidate)
        if per_entry and per_entry[0] is None:
            notes.append(f"{candidate} cannot be measured on the build host (no TF32 on a CPU): "
                         "each load measures it on its GPU against max_error"
                         + (", on the references only (the --calibration inputs are not "
                            "measured for it)" if calibrated else ""))
    entries = [dataclasses.replace(entry, precision_error={
        name: errors[index] for name, errors in measured.items()})
        for index, entry in enumerate(entries)]
    default = "fp32" if precision == AUTO_PRECISION else precision
    layouts: tuple[str, ...] = (CONTIGUOUS,)
    if channels_last:
        why = _channels_last_refusal(forward, entries, samples, max_error, pools)
        if why is None:
            layouts = LAYOUTS
            notes.append("channels-last graphs are listed (the model has a 2-D convolution): "
                         "`qkan-pack warm --precision auto` times each precision in both "
                         "layouts and keeps channels-last only where it is faster")
        else:
            notes.append(f"channels-last graphs are not listed: {why}")
    policy = PrecisionPolicy(default=default, max_error=max_error, allowed=tuple(allowed),
                             layouts=layouts)
    return policy, entries, notes


def _channels_last_refusal(forward: Callable[..., Any], entries: Sequence[ShapeEntry],
                           samples: Sequence[GateSample | CalibrationSample],
                           max_error: float, pools: Sequence[ChannelPool]) -> str | None:
    """Why this model cannot be served channels-last, in words (None: it can): its forward
    fails on channels-last inputs (a ``view`` of a convolution's output), or answers beyond
    ``max_error`` in float32, on the reference inputs (the calibration samples are for the
    precisions' range; a layout moves no value)."""
    references = [sample for sample in samples if isinstance(sample, GateSample)]
    try:
        _, figures = _measure(forward, entries, references, "fp32", max_error, CHANNELS_LAST,
                              pools=pools)
    except PrecisionError as exc:
        if exc.problem is None:
            raise
        return exc.problem
    if figures:
        return str(PrecisionError(precision="fp32 channels-last", device=BUILD_HOST,
                                  max_error=max_error, figures=figures))
    return None


def _refuse_half_models(entries: Sequence[ShapeEntry], precision: str) -> None:
    """Reduced precision applies to float32 models: a half-precision output says the model
    computes in half precision already (and autocast would cast it to the other half dtype)."""
    for entry in entries:
        for name, leaf in zip(entry.outputs.leaf_names(), entry.outputs.leaves()):
            if leaf.dtype in ("bfloat16", "float16"):
                raise OptionError(option="precision", value=precision, expected=(
                    f"precision fp32 for this model: {name} is {leaf.dtype} already (the model "
                    "computes in half precision itself; --precision applies to float32 models)"))


def _measure(forward: Callable[..., Any], entries: Sequence[ShapeEntry],
             samples: Sequence[GateSample | CalibrationSample], precision: str, max_error: float,
             layout: str = CONTIGUOUS, *, pools: Sequence[ChannelPool] = ()
             ) -> tuple[list[float | None], list[tuple[str, str, float]]]:
    """Per entry the worst output's error at ``precision`` in ``layout`` (None: not
    measurable here), and every (shape, output, error) beyond ``max_error``."""
    device = torch.device("cpu")
    if precision_unavailable(precision, device) is not None and precision == "tf32":
        return [None] * len(entries), []
    served = served_forward(forward, precision, device, layout)
    worst: list[float | None] = [0.0] * len(entries)
    beyond: dict[tuple[str, str], float] = {}
    for sample in samples:
        entry = entries[sample.entry]
        got = _run_served(served, sample.inputs, precision, layout, max_error)
        names = list(entry.outputs.leaf_names()) or ["output"]
        pool = pools[sample.entry] if pools else None
        for name, error in zip(names, output_errors(got, sample.want, max_error, pool)):
            worst[sample.entry] = max(worst[sample.entry] or 0.0, _rounded(error))
            if error > max_error:
                key = (entry.label, name)
                beyond[key] = max(beyond.get(key, 0.0), error)
    return worst, [(shape, name, error) for (shape, name), error in beyond.items()]


def _run_served(served: Callable[..., Any], inputs: Sequence[torch.Tensor], precision: str,
                layout: str, max_error: float) -> list[torch.Tensor]:
    """The served forward's flat outputs; a forward that fails in ``precision`` or
    ``layout`` (an op without a float16 kernel on this CPU, a ``view`` of a channels-last
    tensor) is a ``PrecisionError`` that says so, which ``auto`` leaves out."""
    try:
        with torch.inference_mode():
            return flatten(served(*inputs))
    except QkanPackError:
        raise
    except Exception as exc:  # the model's own code, under autocast or in another layout
        where = ("on channels-last inputs" if layout == CHANNELS_LAST
                 else f"under {precision} on the build host")
        raise PrecisionError(precision=precision, device=BUILD_HOST, max_error=max_error,
                             problem=f"the forward fails {where} ({describe(exc)})",
                             hint="choose another --precision (bf16 keeps float32's range), "
                                  "or keep fp32; nothing was written") from exc


def _rounded(error: float) -> float:
    """Two digits, as the manifest records figures (an infinite one never is: refused)."""
    return float(f"{error:.2g}") if math.isfinite(error) else error


def _build_hint(precision: str, figures: Sequence[tuple[str, str, float]]) -> str:
    overflow = precision == "fp16" and any(not math.isfinite(f[2]) for f in figures)
    why = "float16 overflows beyond 65504: try bf16 (float32's range); " if overflow else ""
    return (f"{why}raise --max-error if the difference is acceptable, choose another "
            "--precision, or keep fp32; nothing was written")


# ---------------------------------------------------------------------------
# qkan-pack warm --precision auto
# ---------------------------------------------------------------------------


def default_timer(call: TimedCall, sync: Callable[[], None]) -> float:
    """Median host-call-to-result latency (``runtime.latencies``) after warm-up calls."""
    for _ in range(WARMUP_CALLS):
        call()
    sync()
    return statistics.median(latencies(call, TIMED_CALLS, sync))


def choose_precision(path: str | Path, device: str | torch.device = "cuda", *,
                     timer: Timer | None = None,
                     config_overrides: Mapping[str, Any] | None = None) -> PrecisionChoice:
    """Load the artifact at each precision its build allowed that ``device`` can run, in
    each layout it lists (each load gates it there against ``max_error``), time every shape
    with ``timer`` (default: ``default_timer``), and choose the fastest (precision, layout),
    for the artifact and per shape; the figures and refusals come with it."""
    manifest = read_artifact(path).manifest
    policy = _policy_of(manifest, path)
    target = resolve_device(device)
    key, details = precision_key(target)
    run = _Timing(path, target, timer or default_timer, dict(config_overrides or {}))
    measured = {layout: _Measured() for layout in policy.layouts}
    for layout, into in measured.items():
        for precision in policy.allowed:
            run.time(precision, layout, into, report_unavailable=layout == CONTIGUOUS)
    latency = {(p, layout): t for layout, m in measured.items() for p, t in m.latency_us.items()}
    error = {(p, layout): e for layout, m in measured.items() for p, e in m.error.items()}
    (precision, layout), per_shape = pick_precision(latency, error), pick_per_shape(latency, error)
    shapes, layouts = tuple(p for p, _ in per_shape), tuple(lay for _, lay in per_shape)
    contiguous = measured[CONTIGUOUS]
    channels_last = measured.get(CHANNELS_LAST)
    return PrecisionChoice(key=key, precision=precision, details=details,
                           latency_us=contiguous.latency_us, error=contiguous.error,
                           refused=contiguous.refused,
                           shapes=shapes if set(shapes) != {precision} else (),
                           layout=layout,
                           shape_layouts=layouts if set(layouts) != {layout} else (),
                           channels_last=None if channels_last is None
                           else LayoutFigures(**dataclasses.asdict(channels_last)))


@dataclasses.dataclass
class _Measured:
    """One layout's figures while ``choose_precision`` times: per precision, the per-shape
    latencies and errors, and the refusals (``LayoutFigures`` once all are in)."""

    latency_us: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    error: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    refused: dict[str, str] = dataclasses.field(default_factory=dict)


def _policy_of(manifest: Manifest, path: str | Path) -> PrecisionPolicy:
    if manifest.precision is None:
        raise OptionError(option="precision", value="auto", expected=(
            f"an artifact built with reduced precision: {path} was built in float32 only; "
            "rebuild it with --precision auto --max-error REL (or a precision by name)"))
    return manifest.precision


class _Timing:
    """``choose_precision``'s loads: one per (precision, layout), timed per shape."""

    def __init__(self, path: str | Path, target: torch.device, timer: Timer,
                 overrides: dict[str, Any]) -> None:
        self.path, self.target, self.timer, self.overrides = path, target, timer, overrides
        self.sync: Callable[[], None] = ((lambda: torch.cuda.synchronize(target))
                                         if target.type == "cuda" else (lambda: None))

    def time(self, precision: str, layout: str, into: _Measured, *,
             report_unavailable: bool) -> None:
        """Load at ``precision`` in ``layout`` and put its figures, or why it did not load,
        ``into`` the layout's. A precision this device cannot run is said once, with the
        contiguous layout's refusals; a channels-last load that fails for any reason the
        load names is refused (the contiguous graphs are what the artifact was built as:
        their failures are the artifact's, raised)."""
        why = precision_unavailable(precision, self.target)
        if why is not None:
            if report_unavailable:
                into.refused[precision] = why
            return
        # channels-last on this device may fail where build's CPU passed (a capture, a
        # kernel): the layout is refused, the contiguous graphs still chosen among
        refusable = PrecisionError if layout == CONTIGUOUS else QkanPackError
        try:
            predictor = Predictor.load(self.path, device=self.target, precision=precision,
                                       layout=layout, progress=False,
                                       config_overrides=self.overrides)
        except refusable as exc:
            into.refused[precision] = str(exc)
            return
        with predictor:
            latency, measured = _time_shapes(predictor, self.target, self.timer, self.sync)
        into.latency_us[precision] = latency
        if precision != "fp32" or layout != CONTIGUOUS:
            into.error[precision] = measured


def _time_shapes(predictor: Predictor, target: torch.device, timer: Timer,
                 sync: Callable[[], None]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per shape: ``timer``'s seconds per call in microseconds, and the error this load
    measured against the references."""
    artifact = read_artifact(predictor.path, expected_digest=predictor.digest)
    samples, _ = reference_samples(artifact, target)
    times, errors = [], []
    record = predictor.report.precision
    for label, inputs in samples:
        call = TimedCall(predictor, inputs, precision=record.of(label), label=label,
                         layout=record.layout_of(label))
        times.append(round(timer(call, sync) * 1e6, 3))
        errors.append(record.errors.get(label, 0.0))
    return tuple(times), tuple(_rounded(e) for e in errors)


class TimedCall:
    """``predictor(*inputs)`` as a timer's zero-argument call, naming what it runs: the
    ``precision`` and ``layout``, and the shape ``label``."""

    def __init__(self, predictor: Predictor, inputs: list[torch.Tensor], *, precision: str,
                 label: str, layout: str = CONTIGUOUS) -> None:
        self.predictor, self.inputs = predictor, inputs
        self.precision, self.label, self.layout = precision, label, layout

    def __call__(self) -> Any:
        return self.predictor(*self.inputs)


def _candidate(key: str | tuple[str, str]) -> tuple[str, str]:
    """A ranked key as (precision, layout): a bare precision is its contiguous graphs."""
    return (key, CONTIGUOUS) if isinstance(key, str) else key


def pick_precision(latency_us: Mapping[_Key, Sequence[float]],
                   error: Mapping[_Key, Sequence[float]]) -> _Key:
    """The fastest precision, or (precision, layout), by the geometric mean of its per-shape
    latencies (every shape weighs alike, whatever its size); among those within
    ``SPEED_MARGIN`` of it, the one whose precision has the smallest measured error (float32:
    none; a precision's error is the least it showed in any layout: a layout changes which
    kernel computes, not the arithmetic), most precise first on a tie, then contiguous
    first: channels-last is kept only where it beats its precision's contiguous graphs by
    more than the margin."""
    if not latency_us:
        raise PrecisionError(precision="auto", device="this device", max_error=0.0,
                             problem="no precision could be loaded and timed")
    score = {c: geometric_mean(times) for c, times in latency_us.items()}
    fastest = min(score.values())
    near = [c for c in score if score[c] <= fastest * (1 + SPEED_MARGIN)]
    least: dict[str, float] = {}
    for key in latency_us:
        precision = _candidate(key)[0]
        least[precision] = min(least.get(precision, math.inf), max(error.get(key, (0.0,))))

    def rank(key: _Key) -> tuple[float, int, int]:
        precision, layout = _candidate(key)
        return least[precision], _ORDER.index(precision), LAYOUTS.index(layout)

    return min(near, key=rank)


def pick_per_shape(latency_us: Mapping[_Key, Sequence[float]],
                   error: Mapping[_Key, Sequence[float]]) -> tuple[_Key, ...]:
    """Per shape, ``pick_precision``'s rule on that shape's latencies alone: a shape never
    runs a precision (or layout) slower than another one that passed by more than
    ``SPEED_MARGIN`` (a launch-bound batch of one, where half precision saves nothing, keeps
    float32)."""
    shapes = len(next(iter(latency_us.values()), ()))
    return tuple(pick_precision({c: (t[i],) for c, t in latency_us.items()},
                                {c: (e[i],) for c, e in error.items()}) for i in range(shapes))


def record_precision_choice(path: str | Path, choice: PrecisionChoice) -> str:
    """Write ``choice`` into the artifact's manifest (replacing any for the same device key)
    under the writer lock; the new digest."""
    root = Path(path)
    with locked_target(root):
        artifact = read_artifact(root)
        policy = _policy_of(artifact.manifest, root)
        if choice.precision not in policy.allowed:
            raise OptionError(option="precision", value=choice.precision,
                              expected=f"one of the allowed {', '.join(policy.allowed)}")
        if choice.layout not in policy.layouts:
            raise OptionError(option="layout", value=choice.layout,
                              expected=f"one of the listed {', '.join(policy.layouts)}")
        choices = (*[c for c in policy.choices if c.key != choice.key], choice)
        manifest = dataclasses.replace(
            artifact.manifest, precision=dataclasses.replace(policy, choices=choices))
        _, digest = write_artifact(root, manifest, dict(artifact.files), force=True)
    return digest
