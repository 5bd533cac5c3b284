"""Compiled mode: capture inductor's fused kernels instead of the eager ones.

By default (``compiled="auto"``) only where the artifact ships AOTInductor packages of every
shape for this host (``_serve_auto``). With ``compiled="on"`` or ``"shipped"``, after the
eager first forward and the reference self-test, the model goes through ``torch.compile``
(inductor, ``INDUCTOR_MODE``: no inductor CUDA graphs, the runtime captures), every shape
runs once compiled and is checked against the build references, and the runtime captures the
*compiled* callable with its own recipe (one graph per shape, one pool): each replay then
launches inductor's fused kernels. The replay self-test compares with the compiled outputs
on this device. Reduced precision (``build --precision``) and channels-last graphs are
served by the eager model's graphs: compiled mode is float32 and contiguous only.

Inductor's caches ship in the host's kernel set (``qkan-pack warm --compiled``) as the bytes
of ``torch.compiler.save_cache_artifacts()``, digested like every file; at load they are
populated into a private inductor cache directory that lives as long as the load (the
user's own cache is never written, but for the precompiled headers torch's AOTInductor
compile keeps there, ``_aoti``). No matching set: ``"shipped"`` warns and serves the
eager model's graphs; ``"on"`` compiles here (tens of seconds on a GPU). A model that dynamo or
inductor cannot compile, or whose compiled graph cannot be captured, is served as without
compiled mode, with a warning. The cache holds pickles that torch unpickles: shipped
compiled code, under the same trust as the model source.

Not owned here: the capture recipe (``_capture``), runners (``_runners``), choosing the set
(``_kernels.matching_set``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import CaptureError, PrecompileRefusedError, SelfTestError
from ..format import CapturePolicy, KernelSet, Manifest
from ._artifact import VerifiedArtifact
from ._calling import bind_forward
from ._kernels import (
    PROCESS_CACHES,
    PrecompiledExport,
    matching_set,
    precompiled_dir,
    process_environment,
)
from ._options import CROSS_SOLVER_TOLERANCE, INDUCTOR_MODE, LoadOptions
from ._precompiled import all_aoti, autotune_results, load_precompiled, precompile
from ._report import LoadReport
from ._runners import EagerRunner, GraphRunner, Sample
from ._selftest import check_outputs
from ._source import describe
from ._tree import flatten

#: Internal to ``qkan_pack.runtime``: the package exports nothing from this module.
__all__: list[str] = []

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
_HINT = ("inductor's fused kernels disagree with the build references beyond the tolerance; "
         "load without compiled mode, or pass reference_tolerance=(rtol, atol)")

Runner = EagerRunner | GraphRunner
#: ``_load._make_runner``: the runner of a forward (eager on a CPU, captured graphs on a GPU).
MakeRunner = Callable[[torch.nn.Module, Callable[..., Any], torch.device, Manifest, list[Sample],
                       list[list[torch.Tensor]], LoadReport, LoadOptions], Runner]


def host_set(artifact: VerifiedArtifact, target: torch.device) -> tuple[KernelSet | None, str]:
    """The kernel set shipped for this host, where compiled mode's forms live, and a
    sentence saying why there is none; looked up once per compiled load."""
    if target.type != "cuda":
        return None, "precompiled graphs ship for GPU hosts only"
    return matching_set(artifact, target.index or 0)


def shipped_inductor(artifact: VerifiedArtifact, kernel_set: KernelSet | None,
                     why: str) -> tuple[bytes | None, str]:
    """The set's inductor cache (verified bytes), and a sentence saying which/why not
    (``why``: ``host_set``'s, when there is no set)."""
    if kernel_set is None:
        return None, why
    name = kernel_set.details.get("inductor")
    if not name or name not in artifact.files:
        return None, (f"the kernel set {kernel_set.key} carries no inductor cache (run "
                      "`qkan-pack warm --compiled` on this kind of host)")
    return artifact.files[name], f"shipped inductor cache {kernel_set.key}"


def shipped_precompiled(artifact: VerifiedArtifact, kernel_set: KernelSet | None, why: str
                        ) -> tuple[tuple[str, bytes, dict[str, bytes]] | None, str]:
    """The set's precompiled graphs (set key, plan, graph files by name), and a sentence
    saying which/why not (``why``: ``host_set``'s, when there is no set)."""
    if kernel_set is None:
        return None, why
    plan = kernel_set.details.get("precompiled")
    if not plan or plan not in artifact.files:
        refused = kernel_set.details.get("precompiled_refused")
        return None, (f"the kernel set {kernel_set.key} has no precompiled graphs ("
                      + (f"warm refused them: {refused})" if refused else
                         "run `qkan-pack warm --compiled` on this kind of host)"))
    prefix = precompiled_dir(kernel_set.directory) + "/"
    files = {name[len(prefix):]: data for name, data in artifact.files.items()
             if name.startswith(prefix)}
    return (kernel_set.key, artifact.files[plan], files), f"shipped precompiled graphs {kernel_set.key}"


@dataclasses.dataclass(frozen=True)
class CompiledLoad:
    """What compiled mode works with, from the load that asks for it: the model and its
    (precision-bound) forward on ``target``, the verified artifact, the reference samples
    with their eager outputs here (the fallback's replay baseline) and the build's
    (``expected``), the report and options, the eager runner factory (``_load``'s, also the
    fallback's), and warm's exporter (None outside ``qkan-pack warm``'s child load)."""

    model: torch.nn.Module
    forward: Callable[..., Any]
    target: torch.device
    artifact: VerifiedArtifact
    samples: list[Sample]
    eager: list[list[torch.Tensor]]
    expected: list[list[torch.Tensor]]
    report: LoadReport
    options: LoadOptions
    make_runner: MakeRunner
    export: PrecompiledExport | None = None

    def eager_runner(self) -> Runner:
        """The runner without compiled mode."""
        return self.make_runner(self.model, self.forward, self.target, self.artifact.manifest,
                                self.samples, self.eager, self.report, self.options)

    def compiled_runner(self, model: torch.nn.Module, forward: Callable[..., Any],
                        outputs: list[list[torch.Tensor]]) -> Runner:
        """The runner over a compiled ``forward``: whole-model graphs only (compiled code
        inlines submodules), replay held to ``outputs``, the compiled outputs here."""
        manifest = dataclasses.replace(self.artifact.manifest,
                                       capture=CapturePolicy(policy="full", submodules=()))
        return self.make_runner(model, forward, self.target, manifest, self.samples, outputs,
                                self.report, self.options)

    def fall_back(self, why: str) -> Runner:
        """The eager model's graphs after all, saying why."""
        self.report.warn(f"{why}: serving the eager model as without compiled mode")
        self.report.compiled = f"off ({why})"
        return self.eager_runner()


def serve_compiled(load: CompiledLoad) -> Runner:
    """The runner to serve with: the compiled model's (compiled mode) or the eager one's."""
    report, options, samples = load.report, load.options, load.samples
    if options.compiled == "off":
        return load.eager_runner()
    if options.compiled == "auto":
        return _serve_auto(load)
    if report.precision.gated:
        return load.fall_back(f"compiled mode computes in float32, contiguous, only "
                              f"({report.precision} here)")
    kernel_set, none_why = host_set(load.artifact, load.target)
    runner, why = _serve_precompiled(load, shipped_precompiled(load.artifact, kernel_set,
                                                               none_why))
    if runner is not None:
        return runner
    cache, source = shipped_inductor(load.artifact, kernel_set, none_why)
    if cache is None and options.compiled == "shipped":
        return load.fall_back(f"compiled='shipped' but {why}")
    if why:
        report.warn(f"no precompiled graphs: {why}; compiled mode traces the model here "
                    "(torch.compile)")
    manifest = load.artifact.manifest
    before = _dynamo_counts()
    with _inductor_cache(cache, report, load.target) as note, _recompile_room(len(samples)):
        try:
            with report.stage("compile"):
                # a compiled Module is a Module (OptimizedModule); torch annotates the result
                # of torch.compile as a bare callable
                compiled: torch.nn.Module = torch.compile(  # type: ignore[assignment]
                    load.model, mode=INDUCTOR_MODE, dynamic=False)
                compiled_forward = bind_forward(compiled, manifest.input_names, manifest.call)
                outputs = [flatten(_forward(compiled_forward, inputs)) for _, inputs in samples]
        except Exception as exc:  # dynamo or inductor cannot compile this model here
            return load.fall_back(f"torch.compile failed: {describe(exc)}")
        for (label, _), got, want in zip(samples, outputs, load.expected):
            check_outputs(label, "compiled outputs on this host and the build-time references",
                          got, want, _compiled_tolerance(report), _HINT)
        try:
            runner = load.compiled_runner(compiled, compiled_forward, outputs)
        except CaptureError as exc:
            return load.fall_back(f"the compiled model could not be captured ({exc})")
    graphs, breaks = (now - then for now, then in zip(_dynamo_counts(), before))
    report.compiled = (f"inductor (mode {INDUCTOR_MODE}): {graphs} graph(s), {breaks} graph "
                       f"break(s); {note or source}")
    return runner


def _serve_auto(load: CompiledLoad) -> Runner:
    """Compiled mode by default where it adds next to nothing to the start: the kernel set
    for this host ships AOTInductor packages for every shape (``warm --compiled``), which
    torch's C++ loader runs without importing inductor. Anything else serves the eager
    model's graphs without a warning (nothing was asked for); the report says why where
    inductor's forms ship but are not used. Shipped packages this host refuses, or whose
    outputs disagree with the build references, fall back with a warning (warm promised
    them), never refusing a load that did not ask for compiled mode."""
    report = load.report
    if report.precision.gated or load.export is not None:  # warm always says what it makes
        return load.eager_runner()
    kernel_set, none_why = host_set(load.artifact, load.target)
    found, why = shipped_precompiled(load.artifact, kernel_set, none_why)
    if found is None:
        return load.eager_runner()
    try:
        aoti = all_aoti(found[1])
    except PrecompileRefusedError as exc:
        return load.fall_back(exc.reason)
    if not aoti:
        report.compiled = ("off (auto: the shipped precompiled graphs are inductor's Python "
                           "code, whose load imports inductor; compiled='shipped' runs them)")
        return load.eager_runner()
    try:
        runner, refused = _serve_precompiled(load, (found, why))
    except SelfTestError as exc:  # refused as "shipped" would be, but nobody asked for them
        return load.fall_back(f"the shipped AOTInductor packages disagree with the build "
                              f"references ({exc})")
    return runner if runner is not None else load.fall_back(refused)


def _serve_precompiled(load: CompiledLoad,
                       found: tuple[tuple[str, bytes, dict[str, bytes]] | None, str]
                       ) -> tuple[Runner | None, str]:
    """The runner over precompiled graphs (``found``: ``shipped_precompiled``'s answer; or
    made here for ``"on"``), or None and why not (empty when none were looked for)."""
    export = load.export
    # warm makes its own forms: never the ones it is replacing or its probe refused
    shipped, why = (None, "") if export is not None else found
    if shipped is None and load.options.compiled != "on":
        return None, why
    if export is not None and not export.makes_forms:
        return None, "warm's fresh-process probe refused them"
    report, labels = load.report, [label for label, _ in load.samples]
    with _private_inductor_dir() as private, report.stage("compile"):
        try:
            made = None
            if shipped is not None:
                key, plan, files = shipped
                compiled_forward = load_precompiled(load.model, plan, files, labels, load.target,
                                                    report.config)
                source = f"shipped with the kernel set {key}, loaded without tracing"
            else:
                made, files, compiled_forward = precompile(load.model, load.forward, load.samples,
                                                           report.config, load.target)
                source = "traced and compiled here"
            outputs = [_forward(compiled_forward, inputs) for _, inputs in load.samples]
            # first calls autotune: warm ships the choices beside the graphs it made
            autotuned = autotune_results(private) if made is not None and export is not None else {}
        except PrecompileRefusedError as exc:
            return None, _refused(export, exc.reason)
        except Exception as exc:  # inductor failed to compile, load or run its code here
            return None, _refused(export, f"precompiled graphs failed: {describe(exc)}")
    for label, got, want in zip(labels, outputs, load.expected):
        check_outputs(label, "precompiled outputs on this host and the build-time references",
                      got, want, _compiled_tolerance(report), _HINT)
    try:
        runner = load.compiled_runner(load.model, compiled_forward, outputs)
    except CaptureError as exc:
        return None, _refused(export, f"the precompiled graphs could not be captured ({exc})")
    if made is not None and export is not None:  # checked and captured: warm ships them
        export.write_forms(made.to_json(), {**files, **autotuned})
    report.compiled = (f"precompiled: {len(labels)} graph(s) {source}; "
                       f"{compiled_forward.plan.describe_forms()}")
    return runner, ""


def _refused(export: PrecompiledExport | None, reason: str) -> str:
    """``reason``, also told to warm (``export``) as why the model has no precompiled graphs."""
    if export is not None:
        export.write_refusal(reason)
    return reason


def _compiled_tolerance(report: LoadReport) -> tuple[float, float]:
    """Fused kernels reorder float arithmetic (and run in this device's default math, TF32
    included): other arithmetic than the references', checked as such."""
    rtol, atol = report.reference_tolerance
    return max(rtol, CROSS_SOLVER_TOLERANCE[0]), max(atol, CROSS_SOLVER_TOLERANCE[1])


def _forward(forward: Callable[..., Any], inputs: list[torch.Tensor]) -> Any:
    with torch.no_grad():
        return forward(*inputs)


def _dynamo_counts() -> tuple[int, int]:
    """(graphs compiled, graph breaks) so far in this process, from dynamo's counters."""
    from torch._dynamo.utils import counters

    return (int(counters["stats"]["unique_graphs"]),
            int(sum(counters["graph_break"].values())))


@contextlib.contextmanager
def _recompile_room(shapes: int) -> Iterator[None]:
    """One compiled entry per shape (and per submodule frame after a graph break) must fit
    under dynamo's recompile limit (8), or it would silently run eagerly; hitting the raised
    limit fails loudly instead."""
    import torch._dynamo

    with torch._dynamo.config.patch(recompile_limit=max(8, 16 * shapes),
                                    accumulated_recompile_limit=max(256, 64 * shapes),
                                    fail_on_recompile_limit_hit=True):
        yield


@contextlib.contextmanager
def _inductor_cache(cache: bytes | None, report: LoadReport,
                    target: torch.device) -> Iterator[str | None]:
    """Populate a private inductor cache from shipped bytes for the duration of the load;
    yields a note when inductor compiles here instead (no bytes, or unreadable ones)."""
    if cache is None:
        if target.type == "cuda":
            report.warn("compiled mode compiles here: no shipped inductor cache for this host "
                        "(run `qkan-pack warm --compiled` on this kind of host)")
        yield "compiled here"
        return
    with _private_inductor_dir():
        if torch.compiler.load_cache_artifacts(cache) is None:
            report.warn("this torch could not read the shipped inductor cache (its log "
                        "says why); compiled mode compiles here")
            yield "shipped inductor cache unreadable: compiled here"
        else:
            yield None


@contextlib.contextmanager
def _private_inductor_dir() -> Iterator[str]:
    """Inductor's process-wide cache directory pointed at a fresh private one while this
    load compiles or loads compiled code (the user's own cache is never written)."""
    with PROCESS_CACHES, tempfile.TemporaryDirectory(prefix="qkan-pack-inductor-") as private, \
            process_environment({INDUCTOR_CACHE_ENV: private}):
        _clear_inductor_caches()
        try:
            yield private
        finally:
            _clear_inductor_caches()


def _clear_inductor_caches() -> None:
    """Inductor memoises its cache paths; drop them when the directory changes. A process
    that never imported inductor has none to drop: importing it here would cost a load of
    AOTInductor forms the seconds of imports those forms avoid."""
    utils = sys.modules.get("torch._inductor.utils")
    clear_caches = getattr(utils, "clear_caches", None)
    if clear_caches is not None:
        clear_caches()
