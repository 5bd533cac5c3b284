"""``Predictor``: load a verified artifact, pre-capture every shape, serve replay-only calls."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .artifact import VerifiedArtifact
from .capture import EagerRunner, GraphRunner, ShapeRecord
from .errors import DeviceError, InputError, SelfTestError
from .spec import Manifest, ShapeEntry, format_shape, padding_table
from .tree import torch_dtype, unflatten

#: Replay vs eager on the same device: the same kernels on the same data.
REPLAY_TOLERANCE = (1e-5, 1e-6)
#: Same device type and config as at build: only float reassociation differs.
SAME_HOST_TOLERANCE = (1e-4, 1e-5)
#: Other device type or config overrides (e.g. exact CPU solver vs flash GPU solver).
CROSS_HOST_TOLERANCE = (2e-3, 2e-4)


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
    solvers: list[str]
    reference_tolerance: tuple[float, float]
    shapes: list[ShapeRecord] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)
    load_to_ready_seconds: float = 0.0
    pool_bytes: int = 0
    kernel_cache: str = "not used"
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        lines = [
            f"artifact {self.artifact} ({self.digest[:19]}…) on {self.device}",
            f"policy {self.capture_policy}; solvers {', '.join(self.solvers) or '-'}; "
            f"factory device {self.factory_device}; overrides {self.config_overrides or '{}'}",
            f"{'shape':<18}{'policy':<12}{'capture s':>10}{'pool MiB':>10}{'replay err':>12}"
            f"{'ref err':>12}",
        ]
        for r in self.shapes:
            lines.append(
                f"{r.label:<18}{r.policy:<12}{r.capture_seconds:>10.3f}"
                f"{r.pool_bytes / 2**20:>10.2f}{r.replay_max_abs:>12.2e}{r.reference_max_abs:>12.2e}"
            )
        stages = ", ".join(f"{k} {v:.3f}s" for k, v in self.stages.items())
        lines.append(f"ready in {self.load_to_ready_seconds:.3f}s ({stages})")
        lines.append(f"kernel cache: {self.kernel_cache}")
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)


def resolve_device(device: str | torch.device) -> torch.device:
    """Parse a device and check it exists here; a missing GPU is an error, not a crash."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(f"bad device {device!r}: {exc}; use 'cpu', 'cuda' or 'cuda:N'") from None
    if resolved.type == "cpu":
        return resolved
    if resolved.type != "cuda":
        raise DeviceError(f"device {device!r} is not supported; use 'cpu', 'cuda' or 'cuda:N'")
    if not torch.cuda.is_available():
        raise DeviceError(
            f"device {device!r} was asked for but CUDA is not available on this host "
            "(no GPU or a CPU-only torch build); load with device='cpu'"
        )
    index = resolved.index if resolved.index is not None else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise DeviceError(f"device {device!r} does not exist: this host has {count} CUDA device(s)")
    return torch.device("cuda", index)


class Predictor:
    """Replay-only inference over the shapes an artifact declares.

    Build with ``Predictor.load``. Calls accept exactly the manifest's shapes and dtypes
    (dense torch tensors on the CPU or the predictor's device, or numpy arrays); anything
    else raises ``InputError`` listing what is accepted. Documented results, not errors:
    non-contiguous inputs are copied; ``requires_grad`` inputs are read without autograd
    (outputs never require grad); NaN/inf values are computed as given (checking them would
    cost a device sync per call); numpy inputs give numpy outputs.
    """

    def __init__(self, *, artifact: VerifiedArtifact, model: torch.nn.Module,
                 runner: EagerRunner | GraphRunner, device: torch.device, report: LoadReport,
                 pad_batch: bool, copy_outputs: bool) -> None:
        manifest = artifact.manifest
        self.manifest: Manifest = manifest
        self.digest = artifact.digest
        self.path = artifact.path
        self.device = device
        self.report = report
        self.pad_batch = pad_batch
        self.copy_outputs = copy_outputs
        self._model = model
        self._runner: EagerRunner | GraphRunner | None = runner
        self._lock = threading.Lock()
        self._names = manifest.input_names
        self._dtypes = tuple(torch_dtype(d.dtype) for d in manifest.inputs)
        self._index = {tuple(torch.Size(s) for _, s in e.inputs): i
                       for i, e in enumerate(manifest.shapes)}
        self._padding = padding_table(manifest) if pad_batch else {}
        self._fast = _fast_table(manifest, self._dtypes, device)

    # -- construction ------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu", *,
             expected_digest: str | None = None,
             config_overrides: Mapping[str, Any] | None = None,
             pad_batch: bool = False, copy_outputs: bool = True,
             reference_tolerance: tuple[float, float] | None = None,
             replay_tolerance: tuple[float, float] = REPLAY_TOLERANCE,
             kernels: str = "auto", progress: bool | None = None) -> Predictor:
        """Verify, rebuild, load weights, capture every shape (CUDA), self-test, return.

        ``config_overrides`` replace factory arguments at load (e.g. ``{"solver": "flash"}``);
        a factory with a ``device`` parameter receives the target device. ``kernels="auto"``
        uses the artifact's shipped GPU kernels when they match this host (``qkan-pack
        warm``); ``"off"`` compiles as usual.
        """
        from .loading import load_predictor

        return load_predictor(cls, path, device, expected_digest=expected_digest,
                              config_overrides=dict(config_overrides or {}), pad_batch=pad_batch,
                              copy_outputs=copy_outputs, reference_tolerance=reference_tolerance,
                              replay_tolerance=replay_tolerance, kernels=kernels,
                              show_progress=progress)

    # -- calls -------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fast = self._fast
        if fast is not None and len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor):
            x = args[0]
            index = fast.get((x.shape, x.dtype, x.device))
            runner = self._runner
            if index is not None and runner is not None and x.layout == torch.strided:
                if x.requires_grad:
                    x = x.detach()
                with self._lock:
                    out = runner.run_one(index, x, self.copy_outputs)
                if out is not None:
                    return out
        return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """The general path: keywords, numpy, several inputs, structured outputs, padding."""
        runner = self._runner
        if runner is None:
            raise InputError("this predictor is closed; load the artifact again")
        if kwargs:
            args = self._order_keywords(args, kwargs)
        if len(args) != len(self._names):
            raise InputError(
                f"expected {len(self._names)} input(s) ({', '.join(self._names)}), got {len(args)}"
            )
        as_numpy = False
        tensors = []
        for position, value in enumerate(args):
            if not isinstance(value, torch.Tensor):
                value, as_numpy = self._coerce(value, position), True
            tensors.append(value.detach() if value.requires_grad else value)
        index, rows, padded = self._lookup(tensors)
        out_device = tensors[0].device if tensors[0].device != self.device else None
        if as_numpy:
            out_device = torch.device("cpu")
        with self._lock:
            leaves = runner.run(index, tensors, rows, padded, copy=self.copy_outputs,
                                out_device=out_device if self.copy_outputs else None)
        if as_numpy:
            leaves = [leaf.numpy() for leaf in leaves]
        return unflatten(self.manifest.shapes[index].outputs, leaves)

    def _order_keywords(self, args: tuple, kwargs: dict[str, Any]) -> tuple:
        unknown = sorted(set(kwargs) - set(self._names))
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; this artifact takes {list(self._names)}")
        given = dict(zip(self._names, args))
        clash = sorted(set(given) & set(kwargs))
        if clash:
            raise InputError(f"input(s) {clash} given both by position and by name")
        given.update(kwargs)
        missing = [n for n in self._names if n not in given]
        if missing:
            raise InputError(f"missing input(s) {missing}; this artifact takes {list(self._names)}")
        return tuple(given[n] for n in self._names)

    def _coerce(self, value: Any, position: int) -> torch.Tensor:
        name = self._names[position]
        if isinstance(value, np.ndarray):
            array = np.ascontiguousarray(value)
            if not array.dtype.isnative:
                array = array.astype(array.dtype.newbyteorder("="))
            if not array.flags.writeable:
                array = array.copy()  # torch.from_numpy warns on read-only memory
            try:
                return torch.from_numpy(array)
            except TypeError as exc:
                raise InputError(f"input {name!r}: numpy dtype {value.dtype} unsupported: {exc}") from None
        raise InputError(
            f"input {name!r} is a {type(value).__name__}; pass a torch.Tensor or numpy.ndarray "
            f"({self.accepted()})"
        )

    def _lookup(self, tensors: Sequence[torch.Tensor]) -> tuple[int, int | None, Any]:
        for position, (tensor, dtype) in enumerate(zip(tensors, self._dtypes)):
            if tensor.layout != torch.strided:
                raise InputError(
                    f"input {self._names[position]!r} has layout {tensor.layout}; pass a dense "
                    "tensor (.to_dense())"
                )
            if tensor.dtype != dtype:
                raise InputError(
                    f"input {self._names[position]!r} has dtype "
                    f"{str(tensor.dtype).removeprefix('torch.')}; this artifact accepts "
                    f"{self.accepted()}. Convert with .to(torch.{str(dtype).removeprefix('torch.')})"
                )
            if tensor.device.type != "cpu" and tensor.device != self.device:
                raise InputError(
                    f"input {self._names[position]!r} is on {tensor.device}, the predictor on "
                    f"{self.device}; pass a CPU tensor or move it with .to('{self.device}')"
                )
        key = tuple(t.shape for t in tensors)
        index = self._index.get(key)
        if index is not None:
            return index, None, None
        if self._padding:
            return self._padded_entry(key)
        shown = ", ".join(_shape_text(s) for s in key)
        raise InputError(f"input shape {shown} is not in the manifest; accepted: {self.accepted()}")

    def _padded_entry(self, key: tuple) -> tuple[int, int, Any]:
        rows = {s[0] for s in key if len(s)}
        tail = tuple(tuple(s[1:]) for s in key)
        candidates = self._padding.get(tail, [])
        if len(rows) == 1:
            (count,) = rows
            for batch, index in candidates:
                if count <= batch and count > 0:
                    padded = tuple(shape for _, shape in self.manifest.shapes[index].inputs)
                    return index, count, padded
        shown = ", ".join(_shape_text(s) for s in key)
        largest = max((b for b, _ in candidates), default=None)
        hint = f"; batches up to {largest} are padded" if largest else ""
        raise InputError(
            f"input shape {shown} is not in the manifest and cannot be padded to it{hint}; "
            f"accepted: {self.accepted()}"
        )

    def accepted(self) -> str:
        """The shapes and dtypes this artifact accepts, as one line."""
        dtypes = {d.name: d.dtype for d in self.manifest.inputs}
        shapes = " | ".join(_entry_label(e, dtypes) for e in self.manifest.shapes)
        return shapes + (" (smaller batches padded)" if self.pad_batch else "")

    # -- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Free captured graphs and their memory pool; later calls raise InputError."""
        with self._lock:
            if self._runner is not None:
                self._runner.close()
            self._runner = None
            self._model = None  # type: ignore[assignment]

    def __enter__(self) -> Predictor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._runner is None else "ready"
        return f"Predictor({str(self.path)!r}, device={self.device}, {state}, {self.accepted()})"


def _fast_table(manifest: Manifest, dtypes: Sequence[torch.dtype], device: torch.device
                ) -> dict[tuple, int] | None:
    """(shape, dtype, device) -> shape index for one-input, one-tensor-output artifacts."""
    single_output = all(e.outputs.kind == "tensor" for e in manifest.shapes)
    if len(manifest.inputs) != 1 or not single_output:
        return None
    devices = {torch.device("cpu"), device}
    return {(torch.Size(entry.inputs[0][1]), dtypes[0], dev): index
            for index, entry in enumerate(manifest.shapes) for dev in devices}


def _shape_text(shape: Sequence[int]) -> str:
    return format_shape(shape) if len(shape) else "() (a 0-d tensor)"


def _entry_label(entry: ShapeEntry, dtypes: Mapping[str, str]) -> str:
    if len(entry.inputs) == 1:
        name, shape = entry.inputs[0]
        return f"{format_shape(shape)} {dtypes[name]}"
    return ", ".join(f"{n}: {format_shape(s)} {dtypes[n]}" for n, s in entry.inputs)


def compare(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor],
            tolerance: tuple[float, float]) -> tuple[float, bool]:
    """Largest absolute difference over all leaves, and whether all are within tolerance."""
    rtol, atol = tolerance
    worst, ok = 0.0, True
    for got, want in zip(actual, expected):
        got = got.detach().to("cpu")
        want = want.detach().to("cpu")
        if got.shape != want.shape or got.dtype != want.dtype:
            return float("inf"), False
        if not got.is_floating_point():
            ok &= bool(torch.equal(got, want))
            worst = max(worst, 0.0 if torch.equal(got, want) else float("inf"))
            continue
        diff = (got.double() - want.double()).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        ok &= bool(torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol))
    return worst, ok


def self_test_failure(label: str, what: str, error: float, tolerance: tuple[float, float],
                      hint: str) -> SelfTestError:
    rtol, atol = tolerance
    return SelfTestError(
        f"self-test failed for shape {label}: {what} differ by up to {error:.3g} "
        f"(rtol={rtol:g}, atol={atol:g}). {hint}"
    )


def warn(report: LoadReport, message: str) -> None:
    report.warnings.append(message)
    warnings.warn(message, stacklevel=3)


