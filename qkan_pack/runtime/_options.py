"""``LoadOptions``: every choice ``Predictor.load`` takes, checked before the artifact is read,
and the default tolerances of the self-tests (torch-free, so the options import cheaply)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import KernelCacheError

KERNEL_MODES = ("auto", "off")
#: Compiled mode (``_compiled``): off; on with shipped inductor caches only; on always.
COMPILED_MODES = ("off", "shipped", "on")
#: torch.compile mode of compiled mode: inductor's fusion without its own CUDA graphs (the
#: runtime captures the compiled callable itself).
INDUCTOR_MODE = "default"
Tolerance = tuple[float, float]
#: Replay vs eager on the same device: the same kernels on the same data.
REPLAY_TOLERANCE: Tolerance = (1e-5, 1e-6)
#: Same device type and config as at build: only float reassociation differs.
SAME_HOST_TOLERANCE: Tolerance = (1e-4, 1e-5)
#: Another device type, the same arithmetic (the reference self-test runs in full float32):
#: measured on an H200 for 7 torchvision/timm/transformers models built on a CPU, at most
#: 2e-6 of the output's scale; a 1.01 scaling of one weight tensor moves outputs by 9e-4 to
#: 4e-2 (benchmarks/results/*zoo*).
CROSS_DEVICE_TOLERANCE: Tolerance = (1e-4, 1e-4)
#: Other arithmetic: config overrides, or a model that picks another solver on this device
#: (QKAN's exact CPU solver vs its flash GPU solver).
CROSS_SOLVER_TOLERANCE: Tolerance = (2e-3, 2e-4)


@dataclass(frozen=True)
class LoadOptions:
    """How to load an artifact.

    - ``expected_digest``: refuse unless the artifact's digest is this ``sha256:…``;
    - ``config_overrides``: factory arguments replaced at load (e.g. ``{"solver": "flash"}``);
    - ``pad_batch``: zero-pad smaller batches up to a captured one (rows must be independent);
    - ``copy_outputs``: False returns the graphs' static buffers (overwritten by the next call);
    - ``reference_tolerance``: ``(rtol, atol)`` against the build references (default by device);
    - ``replay_tolerance``: ``(rtol, atol)`` of replay against eager on this device;
    - ``kernels``: ``"auto"`` uses the artifact's shipped GPU kernels when they match this
      host (``qkan-pack warm``), ``"off"`` compiles as usual;
    - ``progress``: progress bars on stderr (None: when stderr is a terminal);
    - ``compiled``: ``"off"`` captures the eager model; ``"shipped"`` captures the
      ``torch.compile``d model when the artifact ships an inductor cache for this host
      (``qkan-pack warm --compiled``), else warns and captures the eager model; ``"on"``
      captures the compiled model, compiling here when nothing is shipped.
    """

    expected_digest: str | None = None
    config_overrides: Mapping[str, Any] = field(default_factory=dict)
    pad_batch: bool = False
    copy_outputs: bool = True
    reference_tolerance: Tolerance | None = None
    replay_tolerance: Tolerance = REPLAY_TOLERANCE
    kernels: str = "auto"
    progress: bool | None = None
    compiled: str = "off"

    def __post_init__(self) -> None:
        object.__setattr__(self, "config_overrides", dict(self.config_overrides or {}))
        if self.kernels not in KERNEL_MODES:
            raise KernelCacheError(
                f"kernels={self.kernels!r}: use 'auto' (shipped kernels) or 'off'")
        if self.compiled not in COMPILED_MODES:
            raise KernelCacheError(
                f"compiled={self.compiled!r}: use 'off', 'shipped' (shipped inductor caches "
                "only) or 'on' (compile here when none is shipped)")

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any]) -> LoadOptions:
        """Options from ``Predictor.load(**keywords)``; an unknown keyword names the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(keywords) - known)
        if unknown:
            raise TypeError(f"Predictor.load() got unknown option(s) {unknown}; "
                            f"options: {sorted(known)}")
        return cls(**keywords)
