"""The load pipeline behind ``Predictor.load``, in trust order.

verify (sizes, digests, layout, format) -> import the verified source -> build via the
factory -> strict weights -> eval -> eager pass on the device (compiles kernels, and is
the replay self-test's baseline) -> reference self-test -> capture -> replay self-test.
Nothing from the artifact runs before its bytes have matched the manifest.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from .artifact import VerifiedArtifact, read_artifact
from .capture import EagerRunner, GraphRunner, ShapeRecord
from .errors import IncompatibleArtifactError, KernelCacheError
from .predictor import (
    CROSS_HOST_TOLERANCE,
    SAME_HOST_TOLERANCE,
    LoadReport,
    Predictor,
    compare,
    resolve_device,
    self_test_failure,
    warn,
)
from .source import call_factory, entry_function, import_model_source
from .spec import WEIGHTS_NAME, Manifest
from .tree import flatten
from .weights import load_strict, parse_audited


@contextmanager
def _stage(stages: dict[str, float], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        stages[name] = stages.get(name, 0.0) + time.perf_counter() - started


def load_predictor(cls: type[Predictor], path: str | Path, device: str | torch.device, *,
                   expected_digest: str | None, config_overrides: dict[str, Any],
                   pad_batch: bool, copy_outputs: bool,
                   reference_tolerance: tuple[float, float] | None,
                   replay_tolerance: tuple[float, float], kernels: str,
                   show_progress: bool | None) -> Predictor:
    if kernels not in ("auto", "off"):
        raise KernelCacheError(f"kernels={kernels!r}: use 'auto' (shipped kernels) or 'off'")
    started = time.perf_counter()
    stages: dict[str, float] = {}
    with _stage(stages, "verify"):
        artifact = read_artifact(path, expected_digest=expected_digest)
    manifest = artifact.manifest
    target = resolve_device(device)
    if target.type == "cuda":
        with _stage(stages, "cuda init"):
            torch.cuda.init()
            torch.empty(0, device=target)
    config = {**manifest.model.config, **config_overrides}
    report = LoadReport(
        artifact=str(artifact.path), digest=artifact.digest, device=str(target),
        capture_policy=manifest.capture.policy if target.type == "cuda" else "eager (no CUDA)",
        factory_device=str(target) if manifest.model.device_argument else None,
        config=config, config_overrides=dict(config_overrides), solvers=[],
        reference_tolerance=reference_tolerance or _default_tolerance(manifest, target,
                                                                     config_overrides),
    )
    check_compatibility(manifest, report)
    with _kernel_cache(artifact, target, kernels, report), _on_device(target):
        runner, model = _prepare(artifact, target, config, report, stages, replay_tolerance,
                                 show_progress)
    report.stages = stages
    report.load_to_ready_seconds = time.perf_counter() - started
    return cls(artifact=artifact, model=model, runner=runner, device=target, report=report,
               pad_batch=pad_batch, copy_outputs=copy_outputs)


def _on_device(target: torch.device) -> Any:
    """Make the target GPU current while loading: Triton launches on the current device."""
    return torch.cuda.device(target) if target.type == "cuda" else nullcontext()


@contextmanager
def _kernel_cache(artifact: VerifiedArtifact, target: torch.device, kernels: str,
                  report: LoadReport) -> Iterator[None]:
    """Serve Triton from the artifact's shipped kernels while loading, when they match."""
    if target.type != "cuda" or kernels == "off":
        report.kernel_cache = "not used (CPU)" if target.type != "cuda" else "off (compiled as usual)"
        yield
        return
    from .kernels import matching_set, shipped_kernels

    kernel_set, report.kernel_cache = matching_set(artifact, target.index or 0)
    if kernel_set is None:
        yield
        return
    with shipped_kernels(artifact, kernel_set) as counts:
        yield
    report.kernel_cache += f" ({counts['shipped']} shipped, {counts['compiled']} compiled here)"
    if counts["compiled"]:
        warn(report, f"{counts['compiled']} kernel(s) were not in the shipped set and were "
                     "compiled at load; re-run `qkan-pack warm` for this host")


def _prepare(artifact: VerifiedArtifact, target: torch.device, config: dict[str, Any],
             report: LoadReport, stages: dict[str, float],
             replay_tolerance: tuple[float, float], show_progress: bool | None
             ) -> tuple[EagerRunner | GraphRunner, torch.nn.Module]:
    """Build, self-test against references, capture, self-test replay."""
    manifest = artifact.manifest
    model = rebuild_model(artifact, target, config, stages)
    report.solvers = sorted({s for m in model.modules()
                             if isinstance(s := getattr(m, "solver", None), str)})
    with _stage(stages, "references"):
        samples, expected = reference_samples(artifact, target)
    with _stage(stages, "first forward"):
        eager = [flatten(_eager(model, inputs)) for _, inputs in samples]
    reference_errors = _check_references(samples, eager, expected, report.reference_tolerance)
    runner = _make_runner(model, target, manifest, samples, stages, show_progress)
    if isinstance(runner, GraphRunner):  # eager-vs-eager would compare a thing with itself
        try:
            with _stage(stages, "self-test"):
                _check_replay(runner, samples, eager, replay_tolerance, target)
        except BaseException:
            runner.close()
            raise
    for record, error in zip(runner.records, reference_errors):
        record.reference_max_abs = error
    report.shapes = runner.records
    report.pool_bytes = sum(r.pool_bytes for r in runner.records)
    return runner, model


def _default_tolerance(manifest: Manifest, target: torch.device,
                       overrides: Mapping[str, Any]) -> tuple[float, float]:
    same_host = manifest.reference_device == target.type and not overrides
    return SAME_HOST_TOLERANCE if same_host else CROSS_HOST_TOLERANCE


def check_compatibility(manifest: Manifest, report: LoadReport) -> None:
    """Refuse a runtime older than the build host by a breaking version; warn on other skew.

    A model written against a newer torch/qkan may call APIs or rely on numerics this host
    lacks; the self-test catches numeric drift, so smaller skew is a warning.
    """
    from .build import producer_versions

    here = producer_versions()
    for package in ("torch", "qkan"):
        built, local = manifest.producer.get(package), here.get(package)
        if not built:
            continue
        if not local:
            warn(report, f"artifact built with {package} {built}, which is not installed here")
        elif _breaking(built) > _breaking(local):
            raise IncompatibleArtifactError(
                f"artifact built with {package} {built}; this host has {local}, an older "
                f"incompatible release: upgrade {package} to {'.'.join(map(str, _breaking(built)))}"
                " or newer, or rebuild the artifact here"
            )
        elif _release(built)[:2] != _release(local)[:2]:
            warn(report, f"artifact built with {package} {built}, loading with {local}: "
                         "outputs are checked by the self-test")


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit()) or "0"
        parts.append(int(digits[:9]))
    return tuple(parts)


def _breaking(version: str) -> tuple[int, ...]:
    """The component whose change may break compatibility (semver; 0.x counts the minor)."""
    release = (*_release(version), 0, 0)
    return release[:2] if release[0] == 0 else release[:1]


def rebuild_model(artifact: VerifiedArtifact, target: torch.device, config: dict[str, Any],
                  stages: dict[str, float] | None = None) -> torch.nn.Module:
    """Import, build, strictly load weights, eval: the eager model an artifact describes."""
    stages = {} if stages is None else stages
    info = artifact.manifest.model
    with _stage(stages, "import"):
        sources = {p: artifact.files[p] for p in (info.source, *info.includes)}
        module = import_model_source(info.source, sources)
    with _stage(stages, "build"):
        factory = entry_function(module, info.entry, info.source)
        model = call_factory(factory, config, info.source, info.entry, device=str(target))
        model.to(target)
    with _stage(stages, "weights"):
        tensors = parse_audited(artifact.files[WEIGHTS_NAME], WEIGHTS_NAME)
        load_strict(model, tensors, info.tied, f"{artifact.path}/{WEIGHTS_NAME}")
        model.eval()  # after loading: QKAN rebuilds its folded eval caches here
        model.requires_grad_(False)
    return model


def reference_samples(artifact: VerifiedArtifact, target: torch.device
                      ) -> tuple[list[tuple[str, list[torch.Tensor]]], list[list[torch.Tensor]]]:
    """Per manifest shape: (label, reference inputs on ``target``), and the build-time
    reference outputs (on the CPU), in manifest order."""
    manifest = artifact.manifest
    samples, expected = [], []
    for entry in manifest.shapes:
        tensors = parse_audited(artifact.files[entry.reference], entry.reference)
        # read_artifact checked these keys, shapes and dtypes against the manifest
        inputs = [tensors[f"input.{n}"].to(target) for n in manifest.input_names]
        count = len(list(entry.outputs.leaves()))
        outputs = [tensors[f"output.{i}"] for i in range(count)]
        samples.append((entry.label, inputs))
        expected.append(outputs)
    return samples, expected


def _eager(model: torch.nn.Module, inputs: list[torch.Tensor]) -> Any:
    with torch.no_grad():
        return model(*inputs)


def _check_references(samples: list[tuple[str, list[torch.Tensor]]],
                      eager: list[list[torch.Tensor]], expected: list[list[torch.Tensor]],
                      tolerance: tuple[float, float]) -> list[float]:
    errors = []
    for (label, _), got, want in zip(samples, eager, expected):
        error, ok = compare(got, want, tolerance)
        if not ok:
            raise self_test_failure(
                label, "outputs on this host and the build-time references", error, tolerance,
                "The model, weights or runtime differ from the build host; if the difference "
                "is expected (another solver or device), pass reference_tolerance=(rtol, atol)",
            )
        errors.append(error)
    return errors


def _make_runner(model: torch.nn.Module, target: torch.device, manifest: Manifest,
                 samples: list[tuple[str, list[torch.Tensor]]], stages: dict[str, float],
                 show_progress: bool | None) -> EagerRunner | GraphRunner:
    if target.type != "cuda":
        runner = EagerRunner(model, target)
        runner.records = [ShapeRecord(label=label, policy="eager") for label, _ in samples]
        return runner
    runner = GraphRunner(model, target)
    with _stage(stages, "capture"):
        runner.capture(samples, manifest.capture.policy, manifest.capture.submodules,
                       show_progress=show_progress)
    return runner


def _check_replay(runner: EagerRunner | GraphRunner, samples: list[tuple[str, list[torch.Tensor]]],
                  eager: list[list[torch.Tensor]], tolerance: tuple[float, float],
                  target: torch.device) -> None:
    """Replay each shape on its reference inputs; a wrong capture must fail loudly."""
    for index, ((label, inputs), want) in enumerate(zip(samples, eager)):
        got = runner.run(index, inputs, None, None, copy=True)
        error, ok = compare(got, want, tolerance)
        runner.records[index].replay_max_abs = error
        if not ok:
            raise self_test_failure(label, f"replayed outputs and eager outputs on {target}",
                                    error, tolerance, "The captured graph is wrong; report a bug "
                                    "with the artifact, or use --capture submodules")
