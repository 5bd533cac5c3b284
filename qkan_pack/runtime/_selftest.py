"""The one comparison of outputs, and the self-tests a load runs with it.

A load compares twice: eager outputs on this host against the build-time references (is
this the model that was built?), and replayed outputs against eager outputs on the same
device (is the captured graph right?). Tolerances say how far each may drift.

How far a sound model may drift from its references depends on the model: a deep network
accumulates more float32 rounding than a shallow one, a bfloat16 one far more. Build
measures each reference's own rounding noise (its outputs against the same model run in
float64) and a load allows a multiple of it, within the fixed tolerance: tight enough to
refuse a one-channel edit of a transformer, loose enough for another device's summation
order (``benchmarks/results/*noise*`` has the cross-device figures). Past that multiple,
the model runs in float64 on the loading device, which must reproduce the recorded noise
itself: that tells another device's rounding from an edit even for half-precision models,
whose own rounding exceeds the fixed tolerance.

What the self-test cannot do: see an edit smaller than the model's own rounding, or notice
references regenerated together with the edit (a re-signed artifact). Digests pinned out of
band and signatures are the defence against those.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..errors import SelfTestError
from ._options import Tolerance

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["CHANNEL_MIN_ROWS", "HALF_CEILING", "Agreement", "ChannelPool", "compare",
           "proof_agreement", "proof_bound", "spread_for", "structure_difference",
           "uninformative_outputs"]


#: A sound model's outputs stay within this many times the build's float32 rounding noise
#: (cross-device drift stays several times below it; measurements:
#: benchmarks/results/*zoo-noise-bound*) ...
NOISE_FACTOR = 16.0
#: ... and the bound is never below this share of the output's scale (float32 outputs
#: that happen to be exact still reassociate on another host).
NOISE_FLOOR = 1e-6
#: A refusal under the noise bound is looked at again with the model in float64 on this
#: device: float64 results of one model agree across devices to ~1e-15 of their scale, so
#: the references' distance from them is the recorded noise again, up to its two-digit
#: rounding (this margin) and this floor.
FLOAT64_MARGIN = 1.25
FLOAT64_FLOOR = 1e-9
#: The most a half-precision output's recorded noise may loosen the reference check to:
#: four units in the last place of the dtype (bfloat16 2**-7, float16 2**-10).
HALF_CEILING = {torch.bfloat16: 4 * 2.0**-7, torch.float16: 4 * 2.0**-10}


@dataclass(frozen=True)
class Agreement:
    """How far outputs are from the expected ones: the largest absolute difference, the same
    relative to the largest expected magnitude of its output, and whether all are within
    tolerance."""

    max_abs: float
    max_rel: float
    ok: bool


def compare(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor],
            tolerance: Tolerance, *, channel_spread: float | None = None,
            pool: ChannelPool | None = None, first_output: int = 0,
            own_values: bool = False, scales: Sequence[float] | None = None) -> Agreement:
    """Every element within ``rtol * |expected| + atol * scale``, ``scale`` being the largest
    magnitude of that output: the check means the same for logits of 1e2 and for an
    untrained network's outputs of 1e-12 (an absolute atol would be blind to the latter).

    ``channel_spread``: where an output's channels (its last axis, and its second for a
    rank of three or more: NCHW) differ in scale by more than this factor, each is held to
    its own scale (``channel_scales``): beside a column 1e6 larger, a column that is wholly
    wrong is a millionth of the output's scale, which any bound relative to the whole output
    accepts. The proofs and the precision gate, which decide what a user's outputs may lose,
    measure so, with the factor beyond which a channel could be wholly wrong within their
    bound (``spread_for``). A channel's scale is its largest magnitude over ``expected``;
    where that holds fewer than ``CHANNEL_MIN_ROWS`` values per channel (one row shows no
    channel's scale), over ``pool`` too: more float32 outputs of the same call's shape
    (``ChannelPool``; ``first_output``: the index of ``expected[0]`` among the model's
    outputs).

    ``own_values``: each value is also held to its own magnitude, never below ``OWN_FLOOR``
    of its scale: where the rows of one channel are a million apart, the channel's scale
    hides a change in the small rows (for two runs of the same arithmetic, which agree to
    the last bit but for what changed).

    ``scales``: each output's scale, where it is not ``expected``'s own largest magnitude
    (a row run alone is measured on its batch's).

    A different number of outputs (a config override can change it), a shape or dtype
    difference, any difference in a non-float leaf, or a NaN on either side, is infinitely
    far (in both figures: a non-float leaf never mixes an absolute figure into ``max_rel``).
    """
    rtol, atol = tolerance
    inf = float("inf")
    if len(actual) != len(expected):
        return Agreement(inf, inf, False)
    worst_abs, worst_rel, ok = 0.0, 0.0, True
    for index, (got, want) in enumerate(zip(actual, expected, strict=True), first_output):
        got, want = got.detach().to("cpu"), want.detach().to("cpu")
        if got.shape != want.shape or got.dtype != want.dtype:
            return Agreement(float("inf"), float("inf"), False)
        if not got.is_floating_point() or not got.numel():
            if not torch.equal(got, want):
                worst_abs, worst_rel, ok = inf, inf, False
            continue
        got, want = got.double(), want.double()
        diff = (got - want).abs()
        pooled = pool.of(index, want) if pool is not None else None
        scale = channel_scales(want, channel_spread, pooled) if channel_spread else None
        if scale is None:
            scale = (want.abs().max() if scales is None
                     else torch.tensor(scales[index - first_output], dtype=torch.float64))
        if own_values:
            scale = torch.minimum(scale, torch.maximum(want.abs(), scale * OWN_FLOOR))
        largest = float(diff.max())
        if math.isnan(largest) or bool(torch.isnan(scale).any()):  # max() would drop a NaN
            worst_abs, worst_rel, ok = inf, inf, False
            continue
        worst_abs = max(worst_abs, largest)
        worst_rel = max(worst_rel, _relative(diff, scale))
        ok &= bool((diff <= rtol * want.abs() + atol * scale).all())
    return Agreement(worst_abs, worst_rel, ok)


#: ``compare(channel_spread=...)``: never more than this factor (a wider spread is left to
#: the whole output's scale) ...
CHANNEL_SPREAD = 1e3
#: ... and a channel is never held to less than this share of the output's largest
#: magnitude (float32 keeps about seven digits: a channel below it holds the rounding of the
#: large ones' arithmetic) ...
CHANNEL_FLOOR = 1e-7
#: ... and only for outputs with this many values per channel at least: a channel's scale is
#: its largest magnitude over them, and a few values may all be small by chance (a logit
#: near zero in a batch of one is no small channel).
CHANNEL_MIN_ROWS = 4


def spread_for(bound: float) -> float:
    """The channel spread beyond which a channel could be wholly wrong and still within
    ``bound`` of the whole output's scale (a channel ``bound`` times the largest), capped at
    ``CHANNEL_SPREAD``."""
    return min(CHANNEL_SPREAD, 1 / bound) if bound > 0 else CHANNEL_SPREAD


def channel_axes(tensor: torch.Tensor) -> list[int]:
    """The axes whose entries are channels: the last and, at rank 3 or more, the second
    (NCHW); none below rank 2."""
    if tensor.dim() < 2:
        return []
    return sorted({tensor.dim() - 1, 1 if tensor.dim() >= 3 else tensor.dim() - 1})


def channel_maxima(tensor: torch.Tensor, axis: int) -> torch.Tensor:
    """Each channel's largest magnitude along ``axis``, kept broadcastable (float64)."""
    others = [d for d in range(tensor.dim()) if d != axis]
    return tensor.detach().to("cpu").double().abs().amax(dim=others, keepdim=True)


#: What ``ChannelPool.of`` gives per channel axis: the pooled maxima (broadcastable against
#: the output) and how many values per channel they were taken over.
Pooled = dict[int, tuple[torch.Tensor, int]]


class ChannelPool:
    """Each float output's channel scales over the float32 outputs ``add``ed (one declared
    shape's: its reference, calibration samples, extra draws): what a channel is measured
    against where the compared output alone has too few values per channel
    (``CHANNEL_MIN_ROWS``: a batch of one). A channel's pooled scale is an upper quartile of
    its rows' largest magnitudes, not their maximum: one outlier row (a user's reference
    holding a value 1e6 times the rest) must not set every compared row's scale. Never
    another shape's outputs, nor for an output that shows its own scales: a larger scale
    from elsewhere (a longer sequence) hides a channel. Channels are matched by output
    index, rank, axis and size; a pool holds each row's per-channel maxima, not outputs."""

    def __init__(self) -> None:
        self._rows: dict[tuple[int, int, int, int], tuple[list[torch.Tensor], int]] = {}

    def add(self, outputs: Sequence[torch.Tensor]) -> None:
        """Fold one run's flat outputs in."""
        for index, leaf in enumerate(outputs):
            if not leaf.is_floating_point() or not leaf.numel():
                continue
            for axis in channel_axes(leaf):
                size = leaf.shape[axis]
                key = (index, leaf.dim(), axis, size)
                rows, count = self._rows.get(key, ([], 0))
                rows.append(_row_maxima(leaf, axis))
                self._rows[key] = rows, count + leaf.numel() // size

    def of(self, index: int, want: torch.Tensor) -> Pooled:
        """The pooled scales for output ``index`` shaped like ``want``, by channel axis:
        only along the axes where ``want`` holds fewer than ``CHANNEL_MIN_ROWS`` values per
        channel (elsewhere its own values give the scales, and nothing is pooled)."""
        found: Pooled = {}
        for axis in channel_axes(want):
            size = want.shape[axis]
            held = self._rows.get((index, want.dim(), axis, size))
            if held is not None and want.numel() // size < CHANNEL_MIN_ROWS:
                shape = [1] * want.dim()
                shape[axis] = size
                found[axis] = _lower_quantile(torch.cat(held[0])).reshape(shape), held[1]
        return found

    def short(self) -> bool:
        """Whether some output's channels have fewer than ``CHANNEL_MIN_ROWS`` values each."""
        return any(count < CHANNEL_MIN_ROWS for _, count in self._rows.values())


#: ``ChannelPool``'s scale of a channel: this quantile of its rows' largest magnitudes (the
#: lower one: of four rows the second largest, of eight the third).
POOL_QUANTILE = 0.75


def _lower_quantile(rows: torch.Tensor) -> torch.Tensor:
    """Each column's ``POOL_QUANTILE`` quantile over the rows, the lower one (what
    ``torch.quantile(interpolation="lower")`` gives, without its limit of 2**24 rows: a
    flattened 4096x4096 image's pixels are as many)."""
    rank = math.floor(POOL_QUANTILE * (rows.shape[0] - 1)) + 1
    return torch.kthvalue(rows, rank, dim=0).values


def _row_maxima(leaf: torch.Tensor, axis: int) -> torch.Tensor:
    """Each row's (first dim's) largest magnitude per channel along ``axis``: (rows, size)."""
    magnitude = leaf.detach().to("cpu").double().abs()
    others = [d for d in range(1, leaf.dim()) if d != axis]
    per_row = magnitude.amax(dim=others) if others else magnitude
    return per_row.reshape(leaf.shape[0], leaf.shape[axis])


def channel_scales(want: torch.Tensor, spread: float,
                   pooled: Pooled | None = None) -> torch.Tensor | None:
    """Each element's scale by its channel, for a float output of rank 2 or more: along the
    last axis and, at rank 3 or more, the second (NCHW), a channel more than ``spread``
    below the largest is held to its own largest magnitude (over ``want``, or where it has
    fewer than ``CHANNEL_MIN_ROWS`` values per channel, over the ``pooled`` outputs of the
    same shape too), every other channel to the largest channel's (a channel 4x smaller
    cannot hide in the bound: holding it to itself would only refuse a reduced precision's
    errors, which are a share of the whole output's magnitude); an element takes the smaller
    of its two, never below ``CHANNEL_FLOOR`` of the largest; broadcastable against ``want``.
    None where along neither axis the channels' scales differ by more than ``spread`` (one
    scale serves), or no axis has channels of ``CHANNEL_MIN_ROWS`` values."""
    if want.dim() < 2 or not want.abs().max() > 0:  # NaN too
        return None
    scales = []
    for axis in channel_axes(want):
        size = want.shape[axis]
        per_channel, count = channel_maxima(want, axis), want.numel() // size
        if count < CHANNEL_MIN_ROWS and pooled and axis in pooled:
            held, held_count = pooled[axis]
            per_channel, count = torch.maximum(per_channel, held), max(count, held_count)
        if size < 2 or count < CHANNEL_MIN_ROWS:
            continue
        top = per_channel.max()
        if per_channel.min() * spread < top:
            scales.append(torch.where(per_channel * spread < top, per_channel, top))
    if not scales:
        return None
    scale = scales[0] if len(scales) == 1 else torch.minimum(scales[0], scales[1])
    largest = max(float(s.max()) for s in scales)
    return torch.clamp(scale, min=largest * CHANNEL_FLOOR)


#: ``compare(own_values=True)``: a value is never held to less than this share of its
#: scale (a zero, or a value that cancels, rounds like the rest of its channel).
OWN_FLOOR = 1e-4


def _relative(diff: torch.Tensor, scale: torch.Tensor) -> float:
    """The largest difference as a share of its scale: one scale for the output (0-d), or
    one per element by its channels (``channel_scales``). A difference where the scale is
    zero is infinitely far; none at all is zero."""
    if scale.dim() == 0:
        largest, scale_value = float(diff.max()), float(scale)
        return largest / scale_value if scale_value else (0.0 if largest == 0 else math.inf)
    return float((diff / scale).max())


#: The proofs build runs on the model (padding, row independence) compare outputs computed
#: two ways (padded or not, a row with other neighbours or alone): they may differ by this
#: multiple of the entry's float32 rounding noise (the same arithmetic in another order) ...
PROOF_NOISE_FACTOR = 16.0
#: ... never by less than this share of the scale ...
PROOF_FLOOR = 1e-6
#: ... and never by more than this, which is also the bound where the noise was not measured.
PROOF_CEILING = 1e-4


def proof_bound(noise: float | None) -> float:
    """How far a proof's two computations may differ, as a share of each output's (or
    channel's) scale, for an entry with float32 rounding ``noise`` (None: not measured)."""
    if noise is None:
        return PROOF_CEILING
    return min(PROOF_CEILING, max(PROOF_FLOOR, PROOF_NOISE_FACTOR * noise))


def proof_agreement(got: torch.Tensor, want: torch.Tensor, noise: float | None, *,
                    bound: float | None = None, pool: ChannelPool | None = None,
                    output: int = 0, same_kernels: bool = False,
                    whole: float | None = None) -> Agreement:
    """The one comparison of build's proofs: one output (``output``, its index among the
    model's) computed two ways, held to ``proof_bound`` (or ``bound``), per channel where a
    channel could hide within it (``compare(channel_spread=spread_for(bound))``), channels
    scaled over ``pool`` too; where both ways ran the same kernels (``same_kernels``: the
    same batch size, so a value's own arithmetic is unchanged), each value to its own
    magnitude as well (``compare(own_values=True)``); given ``whole``, to that one scale
    instead (a row alone, through other kernels: its batch's largest magnitude)."""
    bound = proof_bound(noise) if bound is None else bound
    if whole is not None:
        return compare([got], [want], (0.0, bound), scales=[whole])
    return compare([got], [want], (0.0, bound), channel_spread=spread_for(bound), pool=pool,
                   first_output=output, own_values=same_kernels)


class Uninformative(NamedTuple):
    """A reference's outputs by which no self-test can tell one model from another, as
    ``name (why)`` texts: the empty ones and the constant ones."""

    empty: list[str]
    constant: list[str]
    total: int  # outputs in all

    @property
    def proves_nothing(self) -> bool:
        """An output with no elements, or every output constant: any weights pass."""
        return bool(self.empty) or (bool(self.constant) and len(self.constant) == self.total)


def uninformative_outputs(outputs: Sequence[torch.Tensor],
                          names: Sequence[str]) -> Uninformative:
    """The empty and the constant outputs among one reference's flat outputs."""
    empty, constant = [], []
    for name, tensor in zip(names, outputs):
        if tensor.numel() == 0:
            empty.append(f"{name} (empty, {'x'.join(map(str, tensor.shape))})")
        elif tensor.numel() > 1 and bool((tensor == tensor.reshape(-1)[0]).all()):
            constant.append(f"{name} (every element {tensor.reshape(-1)[0].item():g})")
    return Uninformative(empty, constant, len(outputs))


def check_outputs(label: str, compared: str, got: Sequence[torch.Tensor],
                  want: Sequence[torch.Tensor], tolerance: Tolerance, hint: str) -> float:
    """``compare``, raising ``SelfTestError`` when outside tolerance; the worst difference."""
    agreement = compare(got, want, tolerance)
    if not agreement.ok:
        raise SelfTestError(shape=label, compared=compared, max_abs=agreement.max_abs,
                            max_rel=agreement.max_rel, tolerance=tolerance, hint=hint)
    return agreement.max_abs


def noise_tolerance(noise: float | None, ceiling: Tolerance) -> Tolerance:
    """The reference tolerance for outputs with float32 rounding ``noise`` (a share of their
    scale; None: not measured), never looser than the fixed ``ceiling``."""
    if noise is None:
        return ceiling
    bound = max(NOISE_FLOOR, NOISE_FACTOR * noise)
    return min(ceiling[0], bound), min(ceiling[1], bound)


def deviation(narrow: Sequence[torch.Tensor], wide: Sequence[torch.Tensor]) -> float | None:
    """How far ``narrow`` outputs are from the float64 ones, as a share of each output's
    scale (``compare``'s ``max_rel``); None when that means nothing: a different number
    of outputs, a floating output the float64 copy still computes in another dtype (unless
    it is the same constant in both), no floating output left to compare (a model that
    casts every output to float32 or bfloat16 returns them so in float64 too: its noise is
    unknown, not zero), or a non-float output that differs."""
    if len(wide) != len(narrow):
        return None
    pairs = []
    for a, b in zip(narrow, wide):
        if b.is_floating_point() and b.dtype != torch.float64:
            if not torch.equal(a.detach().cpu(), b.detach().cpu()):
                return None  # computed in float32 even here: no float64 to measure against
            continue  # a constant (``torch.zeros(2)``, a placeholder loss): nothing to measure
        pairs.append((a.double() if a.is_floating_point() else a, b))
    if not any(b.is_floating_point() for _, b in pairs):
        return None
    found = compare([a for a, _ in pairs], [b for _, b in pairs], (0.0, 0.0)).max_rel
    return found if found < float("inf") else None


@dataclass(frozen=True)
class ReferenceCheck:
    """A shape's outputs against its build references: the largest difference and the
    ``(rtol, atol)`` it was held to."""

    max_abs: float
    tolerance: Tolerance


@dataclass(frozen=True)
class ReferencePolicy:
    """How one load holds every shape to its build references: the fixed ``ceiling``
    ``(rtol, atol)``, where a warning goes (``warn``), and the fix a refusal names
    (``hint``)."""

    ceiling: Tolerance
    warn: Callable[[str], None]
    hint: str


def half_ceiling(outputs: Sequence[torch.Tensor]) -> float | None:
    """The loosest bound a half-precision model's references may be held to, from the dtypes
    its outputs have on this host (None: no half-precision output). Derived from what runs
    here, never from the manifest: a re-hashed noise figure cannot loosen a float32 model."""
    bounds = [HALF_CEILING[t.dtype] for t in outputs if t.dtype in HALF_CEILING]
    return max(bounds) if bounds else None


def structure_difference(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor],
                         names: Sequence[str] = (), *,
                         sides: tuple[str, str] = ("here", "at build")) -> str | None:
    """What differs in the outputs' structure (count, a leaf's shape or dtype), in words,
    ``sides`` naming where ``got`` and ``want`` come from; None when only values may differ.
    A detector's number of detections, say, follows its weights: such a change is no
    rounding, and no tolerance could accept it."""
    ours, theirs = sides
    if len(got) != len(want):
        return f"the model returns {len(got)} tensors {ours}, {len(want)} {theirs}"
    for index, (a, b) in enumerate(zip(got, want)):
        name = names[index] if index < len(names) else f"output {index}"
        if a.shape != b.shape:
            return f"{name} is {_dims(a)} {ours}, {_dims(b)} {theirs}"
        if a.dtype != b.dtype:
            return f"{name} is {str(a.dtype).removeprefix('torch.')} {ours}, " \
                   f"{str(b.dtype).removeprefix('torch.')} {theirs}"
    return None


def _dims(tensor: torch.Tensor) -> str:
    return "x".join(map(str, tensor.shape)) or "a scalar"


def check_reference(label: str, got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], *,
                    noise: float | None, policy: ReferencePolicy,
                    device_float64: Callable[[], list[torch.Tensor] | None],
                    names: Sequence[str] = ()) -> ReferenceCheck:
    """Outputs on this host against the build references, held to the model's own rounding
    noise (``noise_tolerance``; ``noise`` None: to ``policy.ceiling``).

    Beyond that bound, the model is run once more in float64 on this device
    (``device_float64``, only then): the same model reproduces the references' recorded
    distance from float64 (``noise``) whatever this device's summation order or precision,
    an edited one does not. Float32 outputs stay within ``ceiling``; half-precision ones
    (whose own rounding exceeds it) within ``half_ceiling``. Where no float64 copy runs
    here, ``ceiling`` decides, with a warning. Where the noise was not measured, each
    output is held to its own dtype's bound: ``half_ceiling`` for a half-precision one,
    ``ceiling`` for the rest.
    """
    compared = "outputs on this host and the build-time references"
    ceiling, hint = policy.ceiling, policy.hint
    problem = structure_difference(got, want, names)
    if problem is not None:
        raise SelfTestError(shape=label, compared=compared, max_abs=float("inf"),
                            tolerance=ceiling, problem=problem,
                            hint="the model, its weights or the runtime differ from what was "
                                 "built")
    tight = noise_tolerance(noise, ceiling)
    agreement = compare(got, want, tight)
    if agreement.ok:
        return ReferenceCheck(agreement.max_abs, tight)
    half = half_ceiling(got)
    within_ceiling = compare(got, want, ceiling).ok
    if noise is None and half is not None and _each_within(got, want, ceiling, half):
        return ReferenceCheck(agreement.max_abs, (0.0, half))
    if noise is None or (half is None and not within_ceiling):
        raise SelfTestError(shape=label, compared=compared, max_abs=agreement.max_abs,
                            max_rel=agreement.max_rel, tolerance=ceiling, hint=hint)
    wide = device_float64()
    if wide is None and half is None:
        policy.warn(f"shape {label}: outputs differ from the build references by "
             f"{agreement.max_rel:.2g} of their scale, more than {NOISE_FACTOR:g}x the "
             f"model's float32 noise ({noise:.2g}), and no float64 copy of the model runs "
             f"here: accepted under the fixed tolerance {ceiling}; pin the digest or sign the "
             "artifact to rule out an edit")
        return ReferenceCheck(agreement.max_abs, ceiling)
    limit = ceiling[1] if half is None else half
    bound = min(limit, FLOAT64_MARGIN * noise + FLOAT64_FLOOR)
    found = None if wide is None else deviation(want, wide)
    if found is not None and found <= bound and agreement.max_rel <= limit:
        assert wide is not None
        if within_ceiling or _float32_within(got, want, wide, ceiling):
            return ReferenceCheck(agreement.max_abs, (0.0, bound))
        raise SelfTestError(
            shape=label, compared=compared, max_abs=agreement.max_abs,
            max_rel=agreement.max_rel, tolerance=ceiling,
            hint="Float32 outputs are outside the fixed tolerance; the half-precision "
                 f"outputs beside them loosen the bound for themselves only. {hint}")
    raise SelfTestError(
        shape=label, compared=compared, max_abs=agreement.max_abs, max_rel=agreement.max_rel,
        tolerance=(0.0, bound), hint=_float64_hint(noise, found, bound, limit, half, wide))


def _each_within(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor],
                 ceiling: Tolerance, half: float) -> bool:
    """Whether each output keeps its own dtype's bound, where the noise was not measured:
    a half-precision output within ``half`` of its scale (another device's float32 moves a
    value across a rounding boundary), every other output within the fixed ``ceiling``."""
    return all(compare([g], [w], (0.0, half) if g.dtype in HALF_CEILING else ceiling).ok
               for g, w in zip(got, want, strict=True))


def _float32_within(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor],
                    wide: Sequence[torch.Tensor], ceiling: Tolerance) -> bool:
    """Whether the outputs beside half-precision ones keep the fixed ``ceiling``: a bfloat16
    output loosens the bound for itself, never for float32 logits next to it. A float32
    output whose own rounding here (against the model in float64 on this device, ``wide``)
    is beyond the ceiling was computed in half precision and cast up (``logits.float()``)
    and is held as one; a weight edit cannot make a float32 computation look so, since the
    float64 run is of the same weights."""
    for got_leaf, want_leaf, truth in zip(got, want, wide, strict=True):
        if got_leaf.dtype in HALF_CEILING:
            continue
        if got_leaf.is_floating_point() and truth.is_floating_point():
            own = compare([got_leaf.double()], [truth.double()], (0.0, 0.0)).max_rel
            if own > ceiling[1]:
                continue
        if not compare([got_leaf], [want_leaf], ceiling).ok:
            return False
    return True


def _float64_hint(noise: float, found: float | None, bound: float, limit: float,
                  half: float | None, wide: list[torch.Tensor] | None) -> str:
    """Why the float64 check refused, in the figures it compared."""
    what = "bfloat16/float16" if half is not None else "float32"
    if wide is None:
        return (f"The model's {what} rounding noise ({noise:.2g} of the outputs' scale) is "
                "above the fixed tolerance and no float64 copy of the model runs here to tell "
                "rounding from an edit; pin the digest or sign the artifact, and pass "
                "reference_tolerance=(rtol, atol) only if you trust it")
    if found is None:
        return ("The model in float64 here does not give outputs comparable with the "
                "references: the weights, model source or runtime differ from what was built")
    if noise * FLOAT64_MARGIN > limit:
        return (f"The recorded {what} noise ({noise:.2g} of the outputs' scale) is above the "
                f"most this host allows for {what} outputs ({limit:.2g}): the manifest was "
                "edited, or the model is too imprecise to check")
    return (f"The model computed in float64 here is {found:.2g} of the outputs' scale from the "
            f"references; the build measured {noise:.2g} for the model it built, so the same "
            f"model stays within {bound:.2g}: the weights, model source or runtime differ from "
            "what was built")
