"""The load pipeline behind ``Predictor.load``, in trust order.

verify (sizes, digests, layout, format) -> compatibility -> import the verified source ->
build via the factory -> strict weights -> eval -> eager pass on the device (compiles
kernels, and is the replay self-test's baseline) -> reference self-test (full float32) ->
padding self-test (declared padding: one padded call per entry, ``_padcheck``) -> precision
gate (a reduced precision's or channels-last layout's eager outputs against the references,
within ``max_error``; a load all channels-last converts the weights first) -> capture ->
replay self-test. Nothing from the artifact runs before its
bytes have matched the manifest.

Not owned here: how calls are served (``Predictor``), the capture recipe (``_capture``).
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ..errors import QkanPackError
from ..format import WEIGHTS_NAME, Manifest, describe_axes
from ._artifact import VerifiedArtifact, read_artifact
from ._calling import bind_forward, full_float32
from ._capture import capture_session
from ._compat import check_compatibility
from ._compiled import CompiledLoad, serve_compiled
from ._device import ContextStart, resolve_device
from ._float64 import float64_forward, float64_outputs
from ._kernels import PROCESS_CACHES, PrecompiledExport, matching_set, shipped_kernels
from ._layout import to_channels_last
from ._options import (
    CROSS_DEVICE_TOLERANCE,
    CROSS_SOLVER_TOLERANCE,
    SAME_HOST_TOLERANCE,
    LoadOptions,
    Tolerance,
)
from ._padcheck import check_padded_calls
from ._precision import (
    PerShapeForward,
    channels_last_everywhere,
    check_precision,
    load_forward,
    precision_scope,
    replay_tolerance,
    resolve_precision,
)
from ._report import LoadReport, ShapeRecord, timed_stage
from ._runners import EagerRunner, GraphRunner, Sample
from ._selftest import (
    ReferenceCheck,
    ReferencePolicy,
    check_outputs,
    check_reference,
    uninformative_outputs,
)
from ._source import (
    call_factory,
    entry_function,
    import_model_source,
    model_code_failed,
    referenced_modules,
)
from ._tree import ClassTable, flatten, resolve_output_classes
from ._weights import load_strict, parse_audited

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["model_solvers", "rebuild_model", "reference_samples"]


#: Solvers whose arithmetic is the plain PyTorch one a float32 build ran (QKAN's ``exact``):
#: another solver on the loading host is other arithmetic, whatever the manifest records.
EXACT_SOLVERS = ("exact",)
#: Where build computes every reference: a load on this device type is the build's own
#: arithmetic, whatever ``reference_device`` the manifest records.
BUILD_DEVICE_TYPE = "cpu"
_REFERENCE_HINT = ("The model, weights or runtime differ from the build host; if the difference "
                   "is expected (another solver or device), pass reference_tolerance=(rtol, atol)")
_REPLAY_HINT = ("The captured graph is wrong; report a bug with the artifact, or use "
                "--capture submodules")


@dataclass(frozen=True)
class References:
    """The build's evidence, per manifest shape in order: the label and reference inputs on
    the target (``samples``), the reference outputs (``expected``), and the rounding noise
    each shape is held to (None: the fixed tolerance only)."""

    samples: list[Sample]
    expected: list[list[torch.Tensor]]
    noises: list[float | None]


@dataclass
class Loaded:
    """Everything a ``Predictor`` is made of, ready to serve."""

    artifact: VerifiedArtifact
    model: torch.nn.Module
    runner: EagerRunner | GraphRunner
    device: torch.device
    report: LoadReport
    classes: ClassTable  # output classes resolved among the model source's imports


def load(path: str | Path, device: str | torch.device, options: LoadOptions,
         export: PrecompiledExport | None = None) -> Loaded:
    """Verify, rebuild, self-test and capture the artifact at ``path`` on ``device``
    (``export``: ``qkan-pack warm``'s, for the precompiled graphs compiled mode makes).

    A failed load gives back everything it allocated, even while the caller keeps the error
    (logs it, stores it, re-raises it later): see ``_release_frames``."""
    already_handling = sys.exc_info()[1]
    try:
        return _load(path, device, options, export)
    except BaseException as error:
        _release_frames(error, already_handling)
        raise


def _release_frames(error: BaseException | None, stop: BaseException | None) -> None:
    """Clear the locals of the frames a failed load left in ``error``'s tracebacks.

    Those frames hold the model, its weights on the GPU, sample inputs and captured graphs
    with their pools; an error kept by the caller would pin them all. Cleared frames keep
    file and line (tracebacks print as before) and the error keeps its own fields; only
    post-mortem inspection of locals is lost. Every exception chained to it (``__cause__``
    and ``__context__``: model code that raised, a capture that failed inside ``__exit__``)
    is cleared, up to the exception the caller was already handling, never into it.
    """
    seen: set[int] = set()
    pending = [error]
    while pending:
        error = pending.pop()
        if error is None or error is stop or id(error) in seen:
            continue
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)  # skips frames still executing
        pending += [error.__cause__, error.__context__]  # both: a cause may hide a context


def _load(path: str | Path, device: str | torch.device, options: LoadOptions,
          export: PrecompiledExport | None) -> Loaded:
    started = time.perf_counter()
    target = resolve_device(device)
    context = ContextStart(target) if target.type == "cuda" else None
    try:
        verify_started = time.perf_counter()
        artifact = read_artifact(path, expected_digest=options.expected_digest,
                                 trusted_keys=options.trusted_keys)
        report = _new_report(artifact, target, options)
        report.stages["verify"] = time.perf_counter() - verify_started
        check_compatibility(artifact.manifest, report.warn)
        with _caches_first(options, target), _kernel_cache(artifact, target, options.kernels, report):
            if _current_or_cpu(target):  # CPU work, while the driver creates the context
                with report.stage("import"):
                    source_module(artifact)
            if context is not None:  # the wait only: creation overlapped the steps above
                with report.stage("cuda init"):
                    context.wait()
            with _on_device(target):  # setting the device would wait for the context anyway
                model, runner, classes = _prepare(artifact, target, report, options, export)
    finally:
        if context is not None:
            context.join()  # a refused artifact leaves no thread behind
    report.load_to_ready_seconds = time.perf_counter() - started
    return Loaded(artifact=artifact, model=model, runner=runner, device=target, report=report,
                  classes=classes)


def _new_report(artifact: VerifiedArtifact, target: torch.device,
                options: LoadOptions) -> LoadReport:
    manifest = artifact.manifest
    overrides = dict(options.config_overrides)
    padding = []
    if manifest.padding is not None:
        entries = [[shape for _, shape in e.inputs] for e in manifest.shapes]
        padding = [", ".join(f"{k}={v!r}" for k, v in manifest.padding.values.items()),
                   *describe_axes(manifest.padding, entries, manifest.input_names)]
    return LoadReport(
        padding=padding,
        artifact=str(artifact.path), digest=artifact.digest, device=str(target),
        capture_policy=manifest.capture.policy if target.type == "cuda" else "eager (no CUDA)",
        factory_device=str(target) if manifest.model.device_argument else None,
        config={**manifest.model.config, **overrides}, config_overrides=overrides,
        reference_tolerance=options.reference_tolerance or SAME_HOST_TOLERANCE,
    )


def _caches_first(options: LoadOptions, target: torch.device) -> Any:
    """Compiled mode points inductor's process-wide cache at a private copy under
    ``PROCESS_CACHES``, inside the capture session; a load that may do so takes that lock
    first, in the order shipped kernels take it (caches, then capture session: never the
    reverse, which could deadlock against another thread's load). A default (``"auto"``)
    load may only on a GPU, where forms ship: on a CPU, loads on several threads still
    run side by side."""
    may_compile = options.compiled in ("shipped", "on") or (
        options.compiled == "auto" and target.type == "cuda")
    return PROCESS_CACHES if may_compile else nullcontext()


def _current_or_cpu(target: torch.device) -> bool:
    """Whether the model source may be imported before ``target`` is made current: a
    module-level CUDA call in it then still lands on ``target`` (making another GPU current
    would wait for its context, which is what importing first overlaps)."""
    return target.type != "cuda" or target.index == torch.cuda.current_device()


def _on_device(target: torch.device) -> Any:
    """Make the target GPU current while loading: Triton launches on the current device."""
    return torch.cuda.device(target) if target.type == "cuda" else nullcontext()


@contextmanager
def _kernel_cache(artifact: VerifiedArtifact, target: torch.device, kernels: str,
                  report: LoadReport) -> Iterator[None]:
    """Serve Triton from the artifact's shipped kernels while loading, when they match. Shipped
    kernels left unused (this host's Triton outside the supported range, no set for this
    host) are a warning as well as the report's line: the cold start compiles them all."""
    if target.type != "cuda" or kernels == "off":
        report.kernel_cache = "not used (CPU)" if target.type != "cuda" else "off (compiled as usual)"
        yield
        return
    with report.stage("kernel cache"):
        kernel_set, report.kernel_cache = matching_set(artifact, target.index or 0)
    if kernel_set is None:
        if artifact.manifest.kernels:
            report.warn(report.kernel_cache)
        yield
        return
    with ExitStack() as stack:
        with report.stage("kernel cache"):
            counts = stack.enter_context(shipped_kernels(artifact, kernel_set))
        yield
    compiled, report.kernels_compiled = counts.compiled, counts.files
    report.kernel_cache += f" ({counts.shipped} shipped, {len(compiled)} compiled here)"
    if compiled:
        named = ", ".join(compiled[:5]) + (f" and {len(compiled) - 5} more" if len(compiled) > 5 else "")
        report.warn(f"{len(compiled)} kernel(s) were not in the shipped set and were compiled "
                    f"at load ({named}); re-run `qkan-pack warm` for this host")


def _prepare(artifact: VerifiedArtifact, target: torch.device, report: LoadReport,
             options: LoadOptions, export: PrecompiledExport | None
             ) -> tuple[torch.nn.Module, EagerRunner | GraphRunner, ClassTable]:
    """Build, self-test against references, gate the precision, capture, self-test replay."""
    manifest = artifact.manifest
    report.precision = resolve_precision(manifest, target, options.precision, report.warn,
                                         options.layout)
    model = rebuild_model(artifact, target, report.config, report.stages)
    forward = bind_forward(model, manifest.input_names, manifest.call)
    served, precision = load_forward(forward, report.precision, manifest, target)
    report.solvers = model_solvers(model)
    noises: list[float | None] = [None] * len(manifest.shapes)
    if options.reference_tolerance is None:
        report.reference_tolerance = default_tolerance(manifest, target, report.config_overrides,
                                                       report.solvers)
        if report.reference_tolerance != CROSS_SOLVER_TOLERANCE:  # the same arithmetic
            noises = [entry.noise for entry in manifest.shapes]
    with report.stage("references"):
        samples, expected = reference_samples(artifact, target)
    references = References(samples, expected, noises)
    shown = manifest.model.source
    with report.stage("first forward"):  # compiles kernels; outside the session lock
        eager = _eager_outputs(forward, samples, shown)
    classes = _output_classes(artifact, model, report)  # after a forward, as build looks
    with capture_session():  # no other load flips math modes or captures meanwhile
        with report.stage("reference self-test"):
            checks = _check_references(model, forward, references, eager, target, report,
                                       manifest)
        if manifest.padding is not None:
            with report.stage("padding self-test"):
                _check_padding(forward, references, target, report, manifest)
        if channels_last_everywhere(report.precision, manifest):
            to_channels_last(model)  # after the float32 self-tests, before any capture
        with precision_scope(precision, target):  # the math mode graphs capture in
            if report.precision.gated:  # the gate's outputs are the replay baseline too
                with report.stage("precision gate"):
                    eager = _eager_outputs(served, samples, shown)
                    check_precision(report.precision, manifest, target,
                                    [label for label, _ in samples], eager, expected)
            elif target.type == "cuda":  # the replay baseline
                with report.stage("replay baseline"):
                    eager = _eager_outputs(forward, samples, shown)
            runner = serve_compiled(CompiledLoad(  # the eager model's runner unless asked
                model, served, target, artifact, samples, eager, expected, report, options,
                _make_runner, export))
    if isinstance(served, PerShapeForward):
        served.scoped = False  # the lock is released: TF32 switches are no longer ours
    for record, check in zip(runner.records, checks, strict=True):
        record.reference_max_abs, record.reference_tolerance = check.max_abs, check.tolerance
    report.shapes = runner.records
    report.pool_bytes = sum(r.pool_bytes for r in runner.records)
    return model, runner, classes


def _output_classes(artifact: VerifiedArtifact, model: torch.nn.Module,
                    report: LoadReport) -> ClassTable:
    """The recorded output classes, as the model's code makes them available; after a
    forward, as build looked them up (a forward may import the module that defines one)."""
    classes, problems = resolve_output_classes(
        [entry.outputs for entry in artifact.manifest.shapes],
        partial(referenced_modules, source_module(artifact), model))
    for problem in problems:
        report.warn(problem)
    return classes


def _eager_outputs(forward: Any, samples: list[Sample], shown: str) -> list[list[torch.Tensor]]:
    """Every sample's eager outputs, flat. A loop, not a comprehension: on Python 3.11 a
    comprehension is a closure over ``forward``, which a failed load's traceback would keep
    (``_calling.KeywordForward`` says why)."""
    outputs = []
    for label, inputs in samples:
        outputs.append(flatten(eager_forward(forward, inputs, shown=shown, label=label)))
    return outputs


def _check_references(model: torch.nn.Module, forward: Any, references: References,
                      eager: list[list[torch.Tensor]], target: torch.device, report: LoadReport,
                      manifest: Manifest) -> list[ReferenceCheck]:
    """Eager outputs in full float32 (the build host's math) against the build references,
    each shape held to its recorded rounding noise (``check_reference``): TF32 and other
    reduced-precision modes of this device cannot cause a false refusal, and the bound
    stays tight enough to refuse a wrong model. (CPUs compute float32 in full already:
    their first-forward outputs are used as they are.)"""
    outputs = eager
    if target.type == "cuda":
        with full_float32(target):
            outputs = _eager_outputs(forward, references.samples, manifest.model.source)
    policy = ReferencePolicy(report.reference_tolerance, report.warn, _REFERENCE_HINT)
    checks = []
    for (label, inputs), got, want, noise, entry in zip(
            references.samples, outputs, references.expected, references.noises,
            manifest.shapes, strict=True):
        _warn_if_uninformative(label, want, list(entry.outputs.leaf_names()), report)
        measure = partial(_device_float64, model, manifest, inputs)
        checks.append(check_reference(label, got, want, noise=noise, policy=policy,
                                      device_float64=measure,
                                      names=list(entry.outputs.leaf_names())))
    return checks


def _check_padding(forward: Any, references: References, target: torch.device,
                   report: LoadReport, manifest: Manifest) -> None:
    """One padded call per entry a smaller call pads into, against the same call unpadded
    (``_padcheck.check_padded_calls``, the check build proved the padding with), in full
    float32 as the reference self-test: the manifest's pad values and followed dims are
    the ones that hold for this model."""
    run = partial(_flat_eager, forward, manifest.model.source)
    with full_float32(target):
        check_padded_calls(run, references.samples, manifest, references.noises,
                           report.reference_tolerance[1])


def _flat_eager(forward: Any, shown: str, inputs: list[torch.Tensor],
                label: str) -> list[torch.Tensor]:
    return flatten(eager_forward(forward, inputs, shown=shown, label=label))


def _warn_if_uninformative(label: str, want: list[torch.Tensor], names: list[str],
                           report: LoadReport) -> None:
    """Say so when a reference cannot tell models apart (built with
    ``--allow-constant-references``): the self-test passed, but proves nothing for it."""
    found = uninformative_outputs(want, names)
    if found.proves_nothing:
        report.warn(f"shape {label}: the build references "
                    f"{', '.join([*found.empty, *found.constant])} "
                    "carry no information, so the self-test cannot tell this model from an "
                    "edited one: rely on the pinned digest or the signature")


def _device_float64(model: torch.nn.Module, manifest: Manifest,
                    inputs: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """The model's outputs in float64 on this device for one sample; None when a float64
    copy does not fit or fails. The copy is freed before returning."""
    forward = float64_forward(model, manifest.input_names, manifest.call)
    return None if forward is None else float64_outputs(forward, inputs)


def default_tolerance(manifest: Manifest, target: torch.device, overrides: Mapping[str, Any],
                      solvers: list[str]) -> Tolerance:
    """How far this load may be from the build references: the same arithmetic on the same
    device type, on another device type, or other arithmetic altogether.

    The class comes from what this host runs: the loader's own config overrides, or a solver
    other than QKAN's exact one that differs from what the build recorded (QKAN's fused GPU
    solver on a host where the build ran the exact one). Manifest fields can only tighten
    it: recorded solvers that differ from an exact solver running here do not loosen the
    check, so a re-hashed ``model.solvers`` cannot widen the bound a weight edit must pass;
    nor can a ``reference_device`` other than the CPU, where every build computes its
    references, widen a CPU load to the cross-device bound.
    """
    if overrides:
        return CROSS_SOLVER_TOLERANCE
    recorded = manifest.model.solvers or None  # format 1 did not record them
    other_arithmetic = [s for s in solvers if s not in EXACT_SOLVERS]
    if other_arithmetic and (recorded is None or list(recorded) != solvers):
        return CROSS_SOLVER_TOLERANCE
    if target.type in (manifest.reference_device, BUILD_DEVICE_TYPE):
        return SAME_HOST_TOLERANCE
    return CROSS_DEVICE_TOLERANCE


def model_solvers(model: torch.nn.Module) -> list[str]:
    """The solvers a model's modules run (QKAN layers name theirs: exact, flash, ...)."""
    return sorted({s for m in model.modules() if isinstance(s := getattr(m, "solver", None), str)})


def rebuild_model(artifact: VerifiedArtifact, target: torch.device, config: Mapping[str, Any],
                  stages: dict[str, float] | None = None) -> torch.nn.Module:
    """Import, build, strictly load weights, eval: the eager model an artifact describes
    (seconds per step added to ``stages`` when given)."""
    info = artifact.manifest.model
    with timed_stage(stages, "import"):
        module = source_module(artifact)
    with timed_stage(stages, "build"):
        factory = entry_function(module, info.entry, info.source)
        model = call_factory(factory, config, info.source, info.entry, device=str(target))
        model.to(target)
    with timed_stage(stages, "weights"):
        tensors = parse_audited(artifact.files[WEIGHTS_NAME], WEIGHTS_NAME)
        load_strict(model, tensors, info.tied, f"{artifact.path}/{WEIGHTS_NAME}")
        model.eval()  # after loading: QKAN rebuilds its folded eval caches here
        for parameter in model.parameters():  # not Module.requires_grad_: a ScriptModule
            parameter.requires_grad_(False)  # (torch.jit.script/trace) refuses that call
    return model


def source_module(artifact: VerifiedArtifact) -> ModuleType:
    """The artifact's verified model source as a module (imported once per process: the
    module is named after its content), its lines held by the artifact's ``source_lines``."""
    info = artifact.manifest.model
    sources = {p: artifact.files[p] for p in (info.source, *info.includes)}
    return import_model_source(info.source, sources, lines=artifact.source_lines,
                               packages=info.packages)


def reference_samples(artifact: VerifiedArtifact, target: torch.device
                      ) -> tuple[list[Sample], list[list[torch.Tensor]]]:
    """Per manifest shape: (label, reference inputs on ``target``), and the build-time
    reference outputs (on the CPU), in manifest order."""
    manifest = artifact.manifest
    samples, expected = [], []
    for entry in manifest.shapes:
        tensors = parse_audited(artifact.files[entry.reference], entry.reference)
        # read_artifact checked these keys, shapes and dtypes against the manifest
        inputs = [tensors[f"input.{n}"].to(target) for n in manifest.input_names]
        count = len(list(entry.outputs.leaves()))
        samples.append((entry.label, inputs))
        expected.append([tensors[f"output.{i}"] for i in range(count)])
    return samples, expected


def eager_forward(forward: Any, inputs: list[torch.Tensor], *, shown: str = "model source",
                  label: str = "") -> Any:
    """One eager call without autograd (``forward``: a model or ``bind_forward``'s callable);
    model code that raises is a ``ModelSourceError`` naming the load stage."""
    try:
        with torch.no_grad():
            return forward(*inputs)
    except QkanPackError:
        raise
    except Exception as exc:
        where = f"forward on shape {label}" if label else "forward"
        raise model_code_failed("load forward", shown, where, exc) from exc


def _make_runner(model: torch.nn.Module, forward: Any, target: torch.device, manifest: Manifest,
                 samples: list[Sample], eager: list[list[torch.Tensor]], report: LoadReport,
                 options: LoadOptions) -> EagerRunner | GraphRunner:
    """Eager on the CPU; on CUDA capture every shape, then check replay against eager."""
    if target.type != "cuda":
        eager_runner = EagerRunner(forward, target, manifest.model.source)
        eager_runner.records = [ShapeRecord(label=label, policy="eager") for label, _ in samples]
        return eager_runner
    runner = GraphRunner(model, forward, target, manifest.model.source)
    with report.stage("capture"):
        runner.capture(samples, manifest.capture.policy, manifest.capture.submodules,
                       progress=options.progress)
    record = report.precision
    try:
        with report.stage("self-test"):
            _check_replay(runner, samples, eager,
                          [replay_tolerance(options.replay_tolerance, record.of(label))
                           for label, _ in samples], target)
    except BaseException:
        runner.close()
        raise
    glued = [r.label for r in runner.records if r.policy != "full" and record.of(r.label) == "tf32"]
    if glued:
        report.warn(f"tf32: shape(s) {', '.join(glued)} run eager code between captured blocks; "
                    "that code computes in this process's float32 mode when called (TF32 is a "
                    "process-wide switch, on only while capturing)")
    return runner


def _check_replay(runner: GraphRunner, samples: list[Sample], eager: list[list[torch.Tensor]],
                  tolerances: Sequence[Tolerance], target: torch.device) -> None:
    """Replay each shape on its reference inputs, held to its precision's bound; a wrong
    capture must fail loudly."""
    for index, ((label, inputs), want, tolerance) in enumerate(zip(samples, eager, tolerances)):
        got = runner.run(index, inputs, None, copy=True)
        runner.records[index].replay_max_abs = check_outputs(
            label, f"replayed outputs and eager outputs on {target}", got, want, tolerance,
            _REPLAY_HINT)
