"""``LoadOptions``: every choice ``Predictor.load`` takes, checked before the artifact is read,
and the default tolerances of the self-tests (torch-free, so the options import cheaply)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .._checked import CheckedOptions
from ..errors import LoadOptionError, ShapeSpecError
from ..format import COMPILED_MODES, DIGEST_PREFIX, LAYOUTS, PRECISIONS, SHA256_HEX, check_config

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["INDUCTOR_MODE", "LoadOptions"]


KERNEL_MODES = ("auto", "off")
#: ``precision``: what the artifact records for this device, or one precision by name.
PRECISION_MODES = ("recorded", *PRECISIONS)
#: ``layout``: what the artifact records for this device, or one layout by name.
LAYOUT_MODES = ("recorded", *LAYOUTS)
#: torch.compile mode of compiled mode: inductor's fusion without its own CUDA graphs (the
#: runtime captures the compiled callable itself).
INDUCTOR_MODE = "default"
Tolerance = tuple[float, float]
#: Replay vs eager on the same device: the same kernels on the same data.
REPLAY_TOLERANCE: Tolerance = (1e-5, 1e-6)
#: Same device type and config as at build: only float reassociation differs.
SAME_HOST_TOLERANCE: Tolerance = (1e-4, 1e-5)
#: Another device type, the same arithmetic (the reference self-test runs in full float32):
#: reassociation moves a sound model's outputs orders of magnitude less than this, while
#: scaling a single weight tensor by 1.01 moves them well beyond it (measurements:
#: benchmarks/results/*zoo*).
CROSS_DEVICE_TOLERANCE: Tolerance = (1e-4, 1e-4)
#: Other arithmetic: config overrides, or a model that picks another solver on this device
#: (QKAN's exact CPU solver vs its flash GPU solver).
CROSS_SOLVER_TOLERANCE: Tolerance = (2e-3, 2e-4)


@dataclass(frozen=True)
class LoadOptions(CheckedOptions):
    """How to load an artifact.

    - ``expected_digest``: refuse unless the artifact's digest is this ``sha256:…``;
    - ``config_overrides``: factory arguments replaced at load (e.g. ``{"solver": "flash"}``);
    - ``pad_batch``: deprecated (unproven): zero-pad smaller batches up to a captured one;
      an artifact built with ``--pad`` pads as declared, proven at build, without it;
    - ``copy_outputs``: False returns the graphs' static buffers (overwritten by the next call);
    - ``reference_tolerance``: ``(rtol, atol)`` against the build references (default by device);
    - ``replay_tolerance``: ``(rtol, atol)`` of replay against eager on this device;
    - ``kernels``: ``"auto"`` uses the artifact's shipped GPU kernels when they match this
      host (``qkan-pack warm``), ``"off"`` compiles as usual;
    - ``progress``: progress bars on stderr (None: when stderr is a terminal);
    - ``compiled``: ``"auto"`` captures the compiled model where the artifact ships
      AOTInductor packages of every shape for this host (``qkan-pack warm --compiled``),
      which load without importing inductor, else the eager model; ``"off"`` captures the
      eager model; ``"shipped"`` captures the compiled model from any precompiled graphs or
      inductor cache shipped for this host, else warns and captures the eager model;
      ``"on"`` captures the compiled model, compiling here when nothing is shipped.
    - ``trusted_keys``: PEM files (EC public keys, or root certificates for certificate-signed
      artifacts). When given, the artifact's signature (``qkan-pack sign``) must verify with
      one of them and cover exactly its files, before anything of it is parsed or run
      (needs ``pip install 'qkan-pack[sign]'``). Empty: the signature is not looked at.
    - ``precision``: ``"recorded"`` runs what the artifact records for this device (the
      choice ``qkan-pack warm --precision auto`` made for its kind, else the built
      precision); ``"fp32"`` runs float32 whatever it records; ``"tf32"``, ``"bf16"`` or
      ``"fp16"`` runs that one if the artifact's build gated it. Every reduced precision is
      held to the artifact's ``max_error`` on this device (``PrecisionError`` beyond it).
    - ``layout``: ``"recorded"`` captures each shape in the layout the artifact's choice for
      this device pairs with its precision (contiguous where the precision was asked by
      name, or nothing was chosen); ``"contiguous"`` or ``"channels_last"`` captures every
      shape in that one, if the artifact's build lists it (``channels_last``: a model with
      a 2-D convolution built with ``--precision``). A channels-last load is held to
      ``max_error`` as a reduced precision is, in float32 too.

    Every field is checked here, so a wrong option fails before the artifact is touched.
    """

    CALL: ClassVar[str] = "Predictor.load()"

    expected_digest: str | None = None
    config_overrides: Mapping[str, Any] = field(default_factory=dict)
    pad_batch: bool = False
    copy_outputs: bool = True
    reference_tolerance: Tolerance | None = None
    replay_tolerance: Tolerance = REPLAY_TOLERANCE
    kernels: str = "auto"
    progress: bool | None = None
    compiled: str = "auto"
    trusted_keys: Sequence[str | os.PathLike[str]] = ()
    precision: str = "recorded"
    layout: str = "recorded"

    def __post_init__(self) -> None:
        checked = {
            "expected_digest": None if self.expected_digest is None
            else normalise_digest(self.expected_digest),
            "config_overrides": _overrides(self.config_overrides),
            "pad_batch": _flag("pad_batch", self.pad_batch),
            "copy_outputs": _flag("copy_outputs", self.copy_outputs),
            "reference_tolerance": None if self.reference_tolerance is None
            else _tolerance("reference_tolerance", self.reference_tolerance),
            "replay_tolerance": _tolerance("replay_tolerance", self.replay_tolerance),
            "kernels": _choice("kernels", self.kernels, KERNEL_MODES),
            "compiled": _choice("compiled", self.compiled, COMPILED_MODES),
            "progress": None if self.progress is None else _flag("progress", self.progress),
            "trusted_keys": _key_paths(self.trusted_keys),
            "precision": _choice("precision", self.precision, PRECISION_MODES),
            "layout": _choice("layout", self.layout, LAYOUT_MODES),
        }
        self._keep(checked)


def normalise_digest(text: Any) -> str:
    """``sha256:<64 hex>`` from any accepted spelling (case, missing prefix, whitespace)."""
    if isinstance(text, str):
        value = text.strip().lower().removeprefix(DIGEST_PREFIX)
        if SHA256_HEX.match(value):
            return DIGEST_PREFIX + value
    raise LoadOptionError(option="expected_digest", value=text,
                          expected="an artifact digest, 'sha256:' and 64 hex digits "
                                   "(as `qkan-pack build` and `inspect` print it)")


def _overrides(value: Any) -> dict[str, Any]:
    try:
        return check_config(value if value is not None else {}, "config_overrides")
    except ShapeSpecError as exc:
        raise LoadOptionError(option="config_overrides", value=value, expected=str(exc)) from None


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise LoadOptionError(option=name, value=value, expected="True or False")
    return value


def _choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise LoadOptionError(option=name, value=value, expected=f"one of {', '.join(choices)}")
    return value


def _tolerance(name: str, value: Any) -> Tolerance:
    """(rtol, atol): two finite, non-negative real numbers (a NaN tolerance passes nothing,
    an infinite one passes everything: both would make the self-test meaningless)."""
    expected = "(rtol, atol): two finite, non-negative numbers, e.g. (1e-4, 1e-5)"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise LoadOptionError(option=name, value=value, expected=expected)
    try:
        valid = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                    and v >= 0 for v in value)
    except OverflowError:  # an int beyond float's range
        valid = False
    if not valid:
        raise LoadOptionError(option=name, value=value, expected=expected)
    return float(value[0]), float(value[1])


def _key_paths(value: Any) -> tuple[Path, ...]:
    """Trusted key files: a list of existing files (their contents are parsed first thing
    when the load starts, still before the artifact is touched)."""
    expected = "a list of PEM files (EC public keys or root certificates)"
    if isinstance(value, (str, bytes, os.PathLike)) or not isinstance(value, Sequence):
        raise LoadOptionError(option="trusted_keys", value=value, expected=expected)
    for item in value:
        if not isinstance(item, (str, os.PathLike)) or not Path(item).is_file():
            raise LoadOptionError(option="trusted_keys", value=item,
                                  expected=f"{expected}; this one is not a file")
    return tuple(Path(item) for item in value)
