"""Reduced precision: which one a load runs, how it is applied, and its accuracy gate.

``bf16``/``fp16`` run the model's forward under ``torch.autocast`` (the device's own op
lists: matmuls and convolutions in the half dtype, reductions, softmax and norms in float32
on CUDA) and cast half-precision outputs back to float32 inside the same call, so that a
captured graph holds the casts and the predictor copies float32 outputs out as the manifest
describes them. Weights stay float32 (autocast casts them in the graph, ``cache_enabled``
off: torch's CUDA graph notes require it, a cached cast made at warm-up would be read by the
graph from outside its pool). ``tf32`` sets torch's TF32 switches for matmuls and cuDNN:
those are process-wide, so they are flipped only inside ``precision_scope``, under the
capture-session lock, around the gate, the replay baseline and the captures; a graph keeps
the kernels it captured. Eager glue around captured blocks (a submodule fallback) and an
eager CPU runner run later, at call time, in the process's own float32 mode for ``tf32``
(more precise, never less); autocast, being per thread, is applied on every call. A
shape may also be captured channels-last (``_layout``): its call converts its inputs and
outputs, whatever the precision.

The gate: reduced-precision eager outputs on this device against the float32 references,
each output's largest difference as a share of its scale (``compare``'s ``max_rel``), held
to the manifest's ``max_error`` whatever build measured or a choice records; channels-last
outputs, in float32 too, are held to it the same way. Not owned here: the load order
(``_load``), the capture recipe (``_capture``).
"""

from __future__ import annotations

import contextlib
import platform
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..errors import PrecisionError
from ..format import (
    CHANNELS_LAST,
    CONTIGUOUS,
    DEFAULT_MAX_ERROR,
    PRECISIONS,
    Manifest,
    PrecisionChoice,
    PrecisionPolicy,
)
from ._calling import tf32_switches
from ._compat import cpu_model
from ._layout import layout_forward
from ._options import Tolerance
from ._report import PrecisionRecord
from ._selftest import ChannelPool, compare, spread_for
from ._tree import flatten

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["output_errors", "precision_key", "precision_scope", "precision_unavailable",
           "served_forward"]

#: Why a precision cannot run on a device type, whatever the device.
_UNAVAILABLE_ON_CPU = {
    "tf32": "TF32 is a tensor-core format of NVIDIA GPUs (Ampere and later); CPUs compute "
            "float32 in full",
    "fp16": "CPUs have no fast float16 matmuls (autocast would emulate them, slower than "
            "float32); serve bf16 or fp32 on a CPU",
}


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype autocast computes in for ``precision`` (None: no autocast)."""
    name = PRECISIONS[precision].autocast
    return None if name is None else getattr(torch, name)


def precision_unavailable(precision: str, device: torch.device) -> str | None:
    """Why ``precision`` cannot run on ``device``, in words; None when it can."""
    if precision == "fp32":
        return None
    if device.type == "cpu":
        return _UNAVAILABLE_ON_CPU.get(precision)
    if device.type != "cuda":
        return f"qkan-pack runs reduced precision on CPUs and CUDA GPUs, not on {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if precision in ("tf32", "bf16") and major < 8:  # tensor-core TF32 and native bfloat16
        what = "TF32" if precision == "tf32" else "native bfloat16"
        return (f"{what} needs an Ampere or later GPU (compute capability 8.0); "
                f"{torch.cuda.get_device_name(device)} is {major}.{minor}")
    return None


class PrecisionForward:
    """``forward`` under autocast, its floating outputs of the autocast dtype cast back to
    float32: flat output leaves, as ``flat_forward`` gives them (the predictor rebuilds the
    structure from the manifest). An object, not a closure (``_calling.KeywordForward``
    says why)."""

    __slots__ = ("device_type", "dtype", "forward")

    def __init__(self, forward: Callable[..., Any], dtype: torch.dtype,
                 device: torch.device) -> None:
        self.forward = forward
        self.dtype = dtype
        self.device_type = device.type

    def __call__(self, *inputs: Any) -> list[torch.Tensor]:
        with torch.autocast(self.device_type, dtype=self.dtype, cache_enabled=False):
            leaves = flatten(self.forward(*inputs))
        return [leaf.float() if leaf.dtype == self.dtype else leaf for leaf in leaves]


class PerShapeForward:
    """Each manifest shape in its own precision and layout (``warm --precision auto`` chose
    per shape): the call is dispatched on its inputs' shapes to that shape's
    ``served_forward``. TF32's process-wide switches are set around a TF32 shape's call only
    while ``scoped`` (the load, which holds the capture-session lock: the gate and the
    captures); after it, eager calls run in the process's own float32 mode, as
    ``precision_scope`` documents. Outputs are flat leaves for every shape, as
    ``PrecisionForward`` gives them."""

    def __init__(self, forward: Callable[..., Any],
                 candidates: dict[tuple[Any, ...], tuple[str, str]],
                 device: torch.device) -> None:
        self.device = device
        self.precisions = {key: precision for key, (precision, _) in candidates.items()}
        self.forwards = {key: served_forward(forward, precision, device, layout)
                         for key, (precision, layout) in candidates.items()}
        self.fallback = forward
        self.scoped = True

    def __call__(self, *inputs: Any) -> list[torch.Tensor]:
        key = tuple(tuple(t.shape) for t in inputs)
        forward = self.forwards.get(key, self.fallback)
        if self.scoped and self.precisions.get(key) == "tf32":
            with precision_scope("tf32", self.device):
                return flatten(forward(*inputs))
        return flatten(forward(*inputs))


def served_forward(forward: Callable[..., Any], precision: str, device: torch.device,
                   layout: str = CONTIGUOUS) -> Callable[..., Any]:
    """The call that computes in ``precision`` on ``device`` with graphs in ``layout``:
    ``forward`` itself for float32 and TF32 (whose switches ``precision_scope`` sets) in
    the contiguous layout, a ``PrecisionForward`` for a half precision, around a
    ``ChannelsLastForward`` channels-last (the layout converts inside the autocast)."""
    forward = layout_forward(forward, layout)
    dtype = autocast_dtype(precision)
    return forward if dtype is None else PrecisionForward(forward, dtype, device)


@contextlib.contextmanager
def precision_scope(precision: str, device: torch.device) -> Iterator[None]:
    """``precision``'s math for the block: TF32 switches on (and restored after), or autocast
    (so that submodule captures, which call blocks directly, compute as the forward does).

    TF32's switches are process-wide: the caller holds the capture-session lock, as
    ``full_float32`` does, so that no other load captures or checks meanwhile.
    """
    dtype = autocast_dtype(precision)
    if dtype is not None:
        with torch.autocast(device.type, dtype=dtype, cache_enabled=False):
            yield
        return
    if precision != "tf32" or device.type != "cuda":
        yield
        return
    with tf32_switches(True):
        yield


def output_errors(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor],
                  max_error: float = DEFAULT_MAX_ERROR,
                  pool: ChannelPool | None = None) -> list[float]:
    """Each output's largest difference from ``want`` as a share of its scale (``compare``'s
    ``max_rel``), per channel where a channel could be wholly wrong within ``max_error`` of
    the whole output's scale (a reduced precision that zeroes a small column beside a large
    one is seen; ``pool``: the channels' scales over more rows of the same shape, which a
    batch of one alone does not show); infinite for NaN/inf, a changed non-float output, or
    another structure."""
    if len(got) != len(want):
        return [float("inf")] * max(len(want), 1)
    spread = spread_for(max_error)
    return [compare([a], [b], (0.0, 0.0), channel_spread=spread, pool=pool,
                    first_output=index).max_rel
            for index, (a, b) in enumerate(zip(got, want))]


def replay_tolerance(tolerance: Tolerance, precision: str) -> Tolerance:
    """The replay self-test's bound at ``precision``: a graph may pick another kernel for an
    op than eager did (another split of a sum), which moves a result by a rounding unit of
    the arithmetic, a share of the output's scale; float32's own bound is unchanged."""
    if precision == "fp32":
        return tolerance
    return tolerance[0], max(tolerance[1], PRECISIONS[precision].unit)


def precision_key(device: torch.device) -> tuple[str, dict[str, str]]:
    """The key precision choices are recorded under for ``device``'s kind, and its details:
    the GPU model and architecture (what decides which precision is fastest), or for a CPU
    its architecture and model name."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        details = {"gpu": name, "arch": f"sm_{major}{minor}"}
        return f"sm{major}{minor}-{_slug(name)}", details
    name = cpu_model() or "unknown"
    return f"cpu-{platform.machine()}-{_slug(name)}", {"cpu": name, "machine": platform.machine()}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")[:80] or "unknown"


def resolve_precision(manifest: Manifest, device: torch.device, asked: str,
                      warn: Callable[[str], None], layout: str = "recorded") -> PrecisionRecord:
    """The precision and layout this load runs, and why: ``asked`` (``LoadOptions.precision``)
    when it names one, else the artifact's choice for this device's key, else its default;
    ``layout`` (``LoadOptions.layout``) when it names one, else the layout the choice pairs
    with its precision (contiguous for a precision asked by name or built in). A recorded
    precision this device cannot run falls back to float32 (contiguous) with a warning; one
    asked for explicitly is refused (``PrecisionError``), as is a precision the artifact's
    build did not gate or a layout it does not list."""
    record = _resolve(manifest, device, asked, warn)
    if layout == "recorded":
        return record
    policy = manifest.precision
    listed = policy.layouts if policy is not None else (CONTIGUOUS,)
    if layout not in listed:
        raise PrecisionError(precision=record.precision, device=str(device),
                             max_error=record.max_error or 0.0, problem=_unlisted(layout, policy))
    record.layout, record.layouts = layout, {}
    record.source += f"; layout {layout} asked at load"
    return record


def _unlisted(layout: str, policy: PrecisionPolicy | None) -> str:
    if policy is None:
        return (f"layout {layout}: the artifact was built in float32 only (rebuild with "
                "--precision to let a load choose its layout)")
    return (f"layout {layout}: the artifact's build lists only {', '.join(policy.layouts)} "
            "(build lists channels-last for a model with a 2-D convolution whose forward "
            "runs on channels-last inputs; its notes say why not)")


def _resolve(manifest: Manifest, device: torch.device, asked: str,
             warn: Callable[[str], None]) -> PrecisionRecord:
    """``resolve_precision`` for the recorded layout."""
    policy = manifest.precision
    if policy is None:
        if asked not in ("recorded", "fp32"):
            raise PrecisionError(precision=asked, device=str(device), max_error=0.0,
                                 problem="the artifact was built in float32 only (rebuild "
                                         "with --precision to gate a reduced precision)")
        return PrecisionRecord(precision="fp32", source="built in float32")
    if asked == "fp32":
        return PrecisionRecord(precision="fp32", source="asked at load",
                               max_error=policy.max_error)
    max_error = policy.max_error
    if asked != "recorded":
        if asked not in policy.allowed:
            raise PrecisionError(precision=asked, device=str(device), max_error=max_error,
                                 problem=f"the artifact's build gated only "
                                         f"{', '.join(policy.allowed)}")
        unavailable = precision_unavailable(asked, device)
        if unavailable is not None:
            raise PrecisionError(precision=asked, device=str(device), max_error=max_error,
                                 problem=unavailable)
        return PrecisionRecord(precision=asked, source="asked at load", max_error=max_error)
    key = precision_key(device)[0] if policy.choices else ""
    choice = policy.choice(key) if key else None
    if choice is not None and choice.per_shape:
        return _per_shape_record(manifest, choice, device, max_error, warn)
    layout = CONTIGUOUS
    if choice is not None:
        precision, source = choice.precision, f"chosen by warm for {key}"
        layout = choice.layout
    elif policy.default == "fp32":
        precision, source = "fp32", ("no choice recorded for this device: float32 until "
                                     "`qkan-pack warm --precision auto` chooses")
    else:
        precision, source = policy.default, "recorded at build"
    unavailable = precision_unavailable(precision, device)
    if unavailable is not None:
        warn(f"precision {precision} ({source}) is not available on {device}: {unavailable}; "
             "serving float32")
        return PrecisionRecord(precision="fp32", source=f"{precision} unavailable here",
                               max_error=max_error)
    return PrecisionRecord(precision=precision, source=source, max_error=max_error,
                           layout=layout)


def _per_shape_record(manifest: Manifest, choice: PrecisionChoice, device: torch.device,
                      max_error: float, warn: Callable[[str], None]) -> PrecisionRecord:
    """A per-shape choice as this load runs it: a shape whose precision this device cannot
    run serves float32 in the contiguous layout (with a warning), the others as chosen."""
    shapes, layouts = {}, {}
    for index, entry in enumerate(manifest.shapes):
        precision, layout = choice.for_shape(index), choice.layout_for_shape(index)
        unavailable = precision_unavailable(precision, device)
        if unavailable is not None:
            warn(f"precision {precision} (chosen by warm for {choice.key}, shape {entry.label}) "
                 f"is not available on {device}: {unavailable}; serving float32")
            precision, layout = "fp32", CONTIGUOUS
        shapes[entry.label], layouts[entry.label] = precision, layout
    return PrecisionRecord(precision=choice.precision, source=f"chosen per shape by warm for "
                           f"{choice.key}", max_error=max_error, shapes=shapes,
                           layout=choice.layout, layouts=layouts)


def load_forward(forward: Callable[..., Any], record: PrecisionRecord, manifest: Manifest,
                 device: torch.device) -> tuple[Callable[..., Any], str]:
    """(the call a load serves, the precision its captures run under): one precision's
    ``served_forward`` in one layout under ``precision_scope``, or, for a choice per shape,
    a ``PerShapeForward`` that applies each shape's own (the scope around it then float32)."""
    if not record.shapes and not record.layouts:
        return served_forward(forward, record.precision, device, record.layout), \
            record.precision
    by_key = {tuple(tuple(s) for _, s in entry.inputs): (record.of(entry.label),
                                                          record.layout_of(entry.label))
              for entry in manifest.shapes}
    return PerShapeForward(forward, by_key, device), "fp32"


def channels_last_everywhere(record: PrecisionRecord, manifest: Manifest) -> bool:
    """Whether every shape of the load runs channels-last: its weights are converted once
    (``_layout.to_channels_last``)."""
    return all(record.layout_of(entry.label) == CHANNELS_LAST for entry in manifest.shapes)


def check_precision(record: PrecisionRecord, manifest: Manifest, device: torch.device,
                    labels: Sequence[str], got: Sequence[Sequence[torch.Tensor]],
                    want: Sequence[Sequence[torch.Tensor]]) -> None:
    """The load gate: ``got`` (this device's reduced-precision eager outputs per shape)
    against ``want`` (the float32 references) within the manifest's ``max_error``; fills
    ``record.errors`` (and ``record.build_errors``), raises ``PrecisionError`` with both
    figures beyond it."""
    max_error = record.max_error
    assert max_error is not None, "resolve_precision bounds every reduced precision"
    figures = []
    for label, outputs, references, entry in zip(labels, got, want, manifest.shapes,
                                                 strict=True):
        errors = output_errors(outputs, references, max_error)
        names = list(entry.outputs.leaf_names()) or ["output"]
        record.errors[label] = max(errors, default=0.0)
        record.build_errors[label] = entry.precision_error.get(record.of(label))
        figures += [(label, name, error) for name, error in zip(names, errors)
                    if error > max_error]
    if figures:
        worst = max(figures, key=lambda f: f[2])
        raise PrecisionError(
            precision=record.of(worst[0]), device=str(device), max_error=max_error,
            figures=figures, build_measured=record.build_errors.get(worst[0]),
            hint=_load_hint(record.named(worst[0]), any(f[2] == float("inf") for f in figures)))


def _load_hint(precision: str, overflow: bool) -> str:
    """What to do about outputs beyond the bound (``precision``: as ``PrecisionRecord.named``
    says it, with its layout)."""
    why = ("a NaN/inf or a changed non-float output (float16 overflows beyond 65504: try bf16)"
           if overflow else "this device rounds differently from the build host")
    return (f"The {precision} outputs here are beyond the artifact's max_error ({why}); load "
            "with precision='fp32' (--precision fp32 for verify, predict and serve), or "
            "rebuild with a larger --max-error if that is acceptable")
