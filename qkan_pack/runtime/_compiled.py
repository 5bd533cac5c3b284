"""Compiled mode (opt-in): capture inductor's fused kernels instead of the eager ones.

With ``compiled="on"`` or ``"shipped"``, after the eager first forward and the reference
self-test, the model goes through ``torch.compile`` (inductor, ``INDUCTOR_MODE``: no
inductor CUDA graphs, the runtime captures), every shape runs once compiled and is checked
against the build references, and the runtime captures the *compiled* callable with its own
recipe (one graph per shape, one pool): each replay then launches inductor's fused kernels.
The replay self-test compares with the compiled outputs on this device. Reduced precision
(``build --precision``) is served by the eager model's graphs: compiled mode is float32 only.

Inductor's caches ship in the host's kernel set (``qkan-pack warm --compiled``) as the bytes
of ``torch.compiler.save_cache_artifacts()``, digested like every file; at load they are
populated into a private inductor cache directory that lives as long as the load (the
user's own cache is never written). No matching set: ``"shipped"`` warns and serves the
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
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..errors import CaptureError
from ..format import CapturePolicy, KernelSet, Manifest
from ._artifact import VerifiedArtifact
from ._calling import bind_forward
from ._kernels import PROCESS_CACHES, matching_set, precompiled_dir
from ._options import CROSS_SOLVER_TOLERANCE, INDUCTOR_MODE, LoadOptions
from ._precompiled import (
    PrecompileRefusedError,
    autotune_results,
    export_forms,
    export_refusal,
    load_precompiled,
    precompile,
    warm_child,
)
from ._report import LoadReport
from ._selftest import check_outputs
from ._source import describe
from ._tree import flatten

#: Internal to ``qkan_pack.runtime``: the package exports nothing from this module.
__all__: list[str] = []

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
_HINT = ("inductor's fused kernels disagree with the build references beyond the tolerance; "
         "load without compiled mode, or pass reference_tolerance=(rtol, atol)")

MakeRunner = Callable[..., Any]  # _load._make_runner(model, forward, target, manifest, samples, ...)


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


def serve_compiled(model: torch.nn.Module, forward: Callable[..., Any], target: torch.device,
                   artifact: VerifiedArtifact, samples: Sequence[tuple[str, list[torch.Tensor]]],
                   eager: list[list[torch.Tensor]], expected: list[list[torch.Tensor]],
                   report: LoadReport, options: LoadOptions, make_runner: MakeRunner) -> Any:
    """The runner to serve with: the compiled model's (compiled mode) or ``make_runner``'s."""
    manifest = artifact.manifest
    today = (model, forward, target, manifest, samples, eager, report, options)
    if options.compiled == "off":
        return make_runner(*today)
    if report.precision.reduced:
        return _today(today, report, make_runner,
                      f"compiled mode computes in float32 only ({report.precision} here)")
    kernel_set, none_why = host_set(artifact, target)
    runner, why = _serve_precompiled(model, forward, target, artifact, samples, expected, report,
                                     options, make_runner, shipped_precompiled(
                                         artifact, kernel_set, none_why))
    if runner is not None:
        return runner
    cache, source = shipped_inductor(artifact, kernel_set, none_why)
    if cache is None and options.compiled == "shipped":
        return _today(today, report, make_runner, f"compiled='shipped' but {why}")
    if why:
        report.warn(f"no precompiled graphs: {why}; compiled mode traces the model here "
                    "(torch.compile)")
    before = _dynamo_counts()
    with _inductor_cache(cache, report, target) as note, _recompile_room(len(samples)):
        try:
            with report.stage("compile"):
                compiled = torch.compile(model, mode=INDUCTOR_MODE, dynamic=False)
                compiled_forward = bind_forward(compiled, manifest.input_names, manifest.call)
                outputs = [flatten(_forward(compiled_forward, inputs)) for _, inputs in samples]
        except Exception as exc:  # dynamo or inductor cannot compile this model here
            return _today(today, report, make_runner, f"torch.compile failed: {describe(exc)}")
        for (label, _), got, want in zip(samples, outputs, expected):
            check_outputs(label, "compiled outputs on this host and the build-time references",
                          got, want, _compiled_tolerance(report), _HINT)
        try:
            runner = make_runner(compiled, compiled_forward, target, _whole_model(manifest),
                                 samples, outputs, report, options)
        except CaptureError as exc:
            return _today(today, report, make_runner,
                          f"the compiled model could not be captured ({exc})")
    graphs, breaks = (now - then for now, then in zip(_dynamo_counts(), before))
    report.compiled = (f"inductor (mode {INDUCTOR_MODE}): {graphs} graph(s), {breaks} graph "
                       f"break(s); {note or source}")
    return runner


def _serve_precompiled(model: torch.nn.Module, forward: Callable[..., Any], target: torch.device,
                       artifact: VerifiedArtifact, samples: Sequence[tuple[str, list[torch.Tensor]]],
                       expected: list[list[torch.Tensor]], report: LoadReport,
                       options: LoadOptions, make_runner: MakeRunner,
                       found: tuple[tuple[str, bytes, dict[str, bytes]] | None, str]
                       ) -> tuple[Any, str]:
    """The runner over precompiled graphs (``found``: ``shipped_precompiled``'s answer; or
    made here for ``"on"``), or None and why not (empty when none were looked for)."""
    # warm makes its own forms: never the ones it is replacing or its probe refused
    shipped, why = (None, "") if warm_child() else found
    if shipped is None and options.compiled != "on":
        return None, why
    labels = [label for label, _ in samples]
    with _private_inductor_dir() as private, report.stage("compile"):
        try:
            if shipped is not None:
                key, plan, files = shipped
                compiled_forward = load_precompiled(model, plan, files, labels, target,
                                                    report.config)
                source = f"shipped with the kernel set {key}, loaded without tracing"
            else:
                made, files, compiled_forward = precompile(model, forward, samples, report.config)
                source = "traced and compiled here"
            outputs = [_forward(compiled_forward, inputs) for _, inputs in samples]
            exporting = shipped is None and warm_child()
            autotuned = autotune_results(private) if exporting else {}  # first calls autotune
        except PrecompileRefusedError as exc:
            export_refusal(exc.reason)
            return None, exc.reason
        except Exception as exc:  # inductor failed to compile, load or run its code here
            reason = f"precompiled graphs failed: {describe(exc)}"
            export_refusal(reason)
            return None, reason
    for label, got, want in zip(labels, outputs, expected):
        check_outputs(label, "precompiled outputs on this host and the build-time references",
                      got, want, _compiled_tolerance(report), _HINT)
    try:
        runner = make_runner(model, compiled_forward, target, _whole_model(artifact.manifest),
                             samples, outputs, report, options)
    except CaptureError as exc:
        reason = f"the precompiled graphs could not be captured ({exc})"
        export_refusal(reason)
        return None, reason
    if exporting:  # checked and captured: warm ships them
        export_forms(made.to_json(), {**files, **autotuned})
    report.compiled = f"precompiled: {len(labels)} inductor graph(s) {source}"
    return runner, ""


def _today(today: tuple, report: LoadReport, make_runner: MakeRunner, why: str) -> Any:
    """Fall back to the eager model's graphs, saying why."""
    report.warn(f"{why}: serving the eager model as without compiled mode")
    report.compiled = f"off ({why})"
    return make_runner(*today)


def _compiled_tolerance(report: LoadReport) -> tuple[float, float]:
    """Fused kernels reorder float arithmetic (and run in this device's default math, TF32
    included): other arithmetic than the references', checked as such."""
    rtol, atol = report.reference_tolerance
    return max(rtol, CROSS_SOLVER_TOLERANCE[0]), max(atol, CROSS_SOLVER_TOLERANCE[1])


def _forward(forward: Callable[..., Any], inputs: list[torch.Tensor]) -> Any:
    with torch.no_grad():
        return forward(*inputs)


def _whole_model(manifest: Manifest) -> Manifest:
    """Compiled code inlines submodules: only whole-model graphs replay inductor's kernels."""
    return dataclasses.replace(manifest, capture=CapturePolicy(policy="full", submodules=()))


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
            _env(INDUCTOR_CACHE_ENV, private):
        _clear_inductor_caches()
        try:
            yield private
        finally:
            _clear_inductor_caches()


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def _clear_inductor_caches() -> None:
    """Inductor memoises its cache paths; drop them when the directory changes."""
    try:
        from torch._inductor.utils import clear_caches
    except ImportError:
        return
    clear_caches()
