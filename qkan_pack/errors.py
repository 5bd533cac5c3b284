"""The whole qkan-pack error hierarchy.

Every error a user can trigger is a ``QkanPackError``; each also subclasses the builtin
that matches its nature, so ``except ValueError`` keeps working::

    QkanPackError
    ├── ShapeSpecError (ValueError)         bad --shapes / --dtype / --config text
    ├── ManifestError (ValueError)          an invalid manifest or plan, at a JSON path
    │   └── IncompatibleArtifactError       a newer format, or an unsafe runtime
    ├── FileReadError (OSError)             a supplied file that is not a readable regular file
    ├── ArtifactError (OSError)             the directory does not match its manifest
    │   ├── DigestMismatchError             not the pinned digest
    │   └── ArtifactSignatureError          a signature that does not prove the artifact
    ├── ModelSourceError (ImportError)      model file, entry point or model code failing
    │   ├── FactoryNotReproducibleError     two factory calls give different models
    │   └── StatefulModelError              answers that depend on earlier calls
    ├── WeakReferencesError (ValueError)    references that cannot tell models apart
    ├── PaddingError (ValueError)           declared padding that changes the answers
    ├── InputFileError (ValueError)         a file of inputs or outputs that cannot be used
    ├── WeightsMismatchError (ValueError)   weights that do not fit the model exactly
    ├── SelfTestError (RuntimeError)        outputs that disagree with eager or the references
    │   └── PrecisionError                  a reduced precision beyond max_error, or unavailable
    ├── CaptureError (RuntimeError)         a graph that could not be captured
    ├── DeviceError (RuntimeError)          a device that does not exist or cannot be used
    ├── KernelCacheError (RuntimeError)     a shipped kernel set that cannot be used
    ├── PrecompileRefusedError (RuntimeError)  no precompiled form: compiled mode falls back
    │   └── AotiPackageError                an AOTInductor package refused before it loads
    ├── BenchError (RuntimeError)           a benchmark that cannot run as asked
    ├── OptionError (ValueError)            a Python API argument outside its domain
    │   └── LoadOptionError                 a Predictor.load option outside its domain
    ├── ServeError (RuntimeError)           a server that cannot start or keep serving
    │   ├── OverloadedError                 a replica's admission is full (HTTP 503)
    │   ├── PlacementError                  replicas the cluster cannot place
    │   ├── ReplicaLoadError                a replica that cannot load on its node
    │   ├── ServeTokenError (also ValueError)  a token or token file serve cannot use
    │   └── RepositoryError (also ValueError)  a model repository or version that cannot serve
    └── InputError (ValueError)             inputs outside the manifest (and the fix)
        ├── MalformedRequestError           a serve request that is not the format at all
        └── PredictorClosedError            a call on (or racing with) a closed predictor

Each class's docstring names its fields (docs/errors.md has the tree with them). Messages
are built from the fields (``_then`` joins an optional part); callers branch on the fields,
never on the text. Messages say what went wrong, where (file, key, shape) and how to fix it.
"""

from __future__ import annotations

import reprlib

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (docs/ARCHITECTURE.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, ClassVar

__all__ = ["AotiPackageError", "ArtifactError", "ArtifactSignatureError", "BenchError",
           "CaptureError", "DeviceError", "DigestMismatchError", "FactoryNotReproducibleError",
           "FileReadError", "IncompatibleArtifactError", "InputError", "InputFileError",
           "KernelCacheError", "LoadOptionError", "MalformedRequestError", "ManifestError",
           "ModelSourceError", "OptionError", "OverloadedError", "PaddingError", "PlacementError",
           "PrecisionError", "PrecompileRefusedError", "PredictorClosedError", "QkanPackError",
           "ReplicaLoadError", "RepositoryError", "SelfTestError", "ServeError", "ServeTokenError",
           "ShapeSpecError", "StatefulModelError", "WeakReferencesError", "WeightsMismatchError"]


def _then(separator: str, text: str) -> str:
    """An optional part of a message: ``separator`` and ``text``, or nothing."""
    return f"{separator}{text}" if text else ""


def _restore(cls: type, args: tuple, state: dict[str, Any]) -> QkanPackError:
    error = cls.__new__(cls, *args)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class QkanPackError(Exception):
    """Root of every error qkan-pack raises on purpose."""

    def __reduce__(self) -> tuple:
        # Fields live in __dict__ and constructors take them by keyword: pickle (Ray sends
        # errors between processes) must not call __init__ with the message alone.
        return _restore, (type(self), self.args, dict(self.__dict__))


class ShapeSpecError(QkanPackError, ValueError):
    """Shape, dtype or config text that does not parse."""


class ManifestError(QkanPackError, ValueError):
    """A manifest (or another JSON document of an artifact: the precompiled plan) that is not
    valid. ``where``: the JSON path of the value refused
    (``manifest.shapes[2].outputs.tensor.shape[1]``; ``manifest`` for the document as a
    whole), None where no document path applies; ``problem``: what is wrong there. The
    message is the two together."""

    def __init__(self, problem: str, *, where: str | None = None) -> None:
        super().__init__(f"{where} {problem}" if where else problem)
        self.problem = problem
        self.where = where


class IncompatibleArtifactError(ManifestError):
    """An artifact this runtime must not load (newer format, unsafe version skew)."""


class FileReadError(QkanPackError, OSError):
    """A file a user or an artifact supplied that ``runtime.read_regular_file`` will not
    read: ``reason`` is ``missing``, ``link``, ``unreadable``, ``special`` (a FIFO, device
    or directory), ``refused`` (its mode or owner) or ``too large``; ``problem`` says it in
    words after the path. Callers reading an artifact or an option say it in their own
    terms (``ArtifactError``, ``LoadOptionError``, ``ServeTokenError``)."""

    def __init__(self, *, path: str, reason: str, problem: str) -> None:
        super().__init__(f"{path} {problem}")
        self.path, self.reason, self.problem = path, reason, problem


class ArtifactError(QkanPackError, OSError):
    """The artifact directory on disk does not match its manifest (``path``: where)."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class DigestMismatchError(ArtifactError):
    """The whole-artifact digest (``actual``) differs from the one the caller pinned
    (``expected``)."""

    def __init__(self, *, path: str, actual: str, expected: str) -> None:
        super().__init__(
            f"artifact {path} has digest {actual}, but {expected} was pinned: the artifact "
            "changed since the digest was taken; refusing to load it", path=path)
        self.actual, self.expected = actual, expected


class ArtifactSignatureError(ArtifactError):
    """Trusted keys were given and the artifact's signature does not prove it.

    ``problem`` is one of ``PROBLEMS``; ``detail`` says what exactly (the library's reason,
    the files that differ); ``path`` is the artifact.
    """

    PROBLEMS: ClassVar[Mapping[str, str]] = {
        "missing": "has no signature ({name}) but trusted keys were given: sign it with "
                   "`qkan-pack sign`, or load without trusted keys",
        "invalid": "has a signature that does not verify ({detail}): the artifact or its "
                   "signature was altered after signing",
        "untrusted": "is signed by a key or certificate none of the trusted keys accept "
                     "({detail})",
        "mismatch": "has a valid signature over other contents ({detail}): files were changed "
                    "after signing",
        "unavailable": "cannot be signed or verified here: that needs the signing extra, "
                       "pip install 'qkan-pack[sign]' ({detail})",
        "signing key": "cannot be signed: {detail}",
        "certificate use": "is signed with a certificate that may not sign code ({detail}): "
                           "the signer needs {code_signing_leaf}",
    }
    #: What a signing certificate must be (one text for ``sign`` and the load's refusals).
    CODE_SIGNING_LEAF: ClassVar[str] = (
        "a leaf certificate with extendedKeyUsage codeSigning and basicConstraints CA:FALSE "
        "(keyUsage, if present, digitalSignature and no keyCertSign), issued under a trusted "
        "root; docs/signing.md, \"Issuing a code-signing certificate\", shows how")

    def __init__(self, *, path: str, problem: str, detail: str = "",
                 name: str = "model.sig") -> None:
        self.problem = problem
        self.detail = detail
        reason = self.PROBLEMS[problem].format(name=name, detail=detail,
                                               code_signing_leaf=self.CODE_SIGNING_LEAF)
        super().__init__(f"artifact {path} {reason}; refusing it", path=path)


class ModelSourceError(QkanPackError, ImportError):
    """The model source cannot be imported, built or run.

    When the model's own code raised, ``stage`` says where (``import``, ``factory``,
    ``build forward``, ``load forward``, ``call``) and the original exception is the
    ``__cause__``; ``path`` is the model file as the user knows it.
    """

    def __init__(self, message: str, *, stage: str | None = None,
                 path: str | None = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.path = path


class FactoryNotReproducibleError(ModelSourceError):
    """Calling the factory twice gives two different models: a load rebuilds the model with
    the factory, so it would not be the model that was built. ``differs`` names the buffers
    or outputs that differ."""

    def __init__(self, *, path: str, entry: str, differs: Sequence[str]) -> None:
        self.differs = tuple(differs)
        super().__init__(
            f"{path}: {entry}() is not reproducible: two calls give models whose "
            f"{', '.join(self.differs[:5])} differ (with the same weights loaded). A load "
            f"rebuilds the model by calling {entry}() again, so it would not be the model "
            "built here: seed your factory (torch.manual_seed at its start), or make such "
            "state a persistent buffer so that it is saved with the weights",
            stage="factory", path=path)


class PrecompileRefusedError(QkanPackError, RuntimeError):
    """This model (or this torch) has no precompiled form (``warm --compiled``'s graphs);
    ``reason`` says why. Compiled mode catches it and falls back to another route."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class AotiPackageError(PrecompileRefusedError):
    """An AOTInductor package refused before this process loads it: ``problem`` is ``static
    libstdc++`` (its wrapper library ``library`` needs ``needed``, not ``libstdc++.so.6``: a
    copy of libstdc++ of its own crashes a torch process), ``unreadable`` or ``child load``
    (a throw-away process that loaded and ran it failed); ``detail`` says what exactly."""

    def __init__(self, *, problem: str, library: str = "", needed: Sequence[str] = (),
                 detail: str = "") -> None:
        self.problem, self.library, self.needed = problem, library, tuple(needed)
        self.detail = detail
        super().__init__(
            f"the AOTInductor package's wrapper library {library} links libstdc++ statically "
            f"(it needs {', '.join(self.needed) or 'no library'}, not libstdc++.so.6), which "
            "crashes a process that has torch's libstdc++ loaded" if problem == "static libstdc++"
            else f"a throw-away process loading and running the AOTInductor package {detail}"
            if problem == "child load" else f"the AOTInductor package cannot be read ({detail})")


class StatefulModelError(ModelSourceError):
    """A forward that changes what later calls answer: ``changed`` names the parameters,
    buffers or outputs that moved after the model ran on other inputs (a running maximum,
    an observer left on in a quantisation-aware model, any state its forward updates). A
    served model answers every client: one client's inputs would change, and could reveal
    themselves in, another's answers."""

    def __init__(self, *, path: str, changed: Sequence[str]) -> None:
        self.changed = tuple(changed)
        super().__init__(
            f"{path}: the model's answers depend on earlier calls: after it ran on other "
            f"inputs, {', '.join(self.changed[:5])} changed. A served model answers many "
            "clients, so one client's inputs would reach another's answers: make forward "
            "leave the model's state alone in eval mode (convert a quantisation-aware model "
            "before packing it, e.g. torch.ao.quantization.convert; freeze observers), or "
            "keep such state out of the model",
            stage="build forward", path=path)


class WeakReferencesError(QkanPackError, ValueError):
    """Reference outputs that cannot tell a right model from a wrong one: ``outputs`` of
    shape ``shape`` are empty or hold one value throughout (a detector that detects nothing
    on random inputs). A self-test against them passes whatever the weights."""

    def __init__(self, *, shape: str, outputs: Sequence[str], problem: str) -> None:
        self.shape, self.outputs, self.problem = shape, tuple(outputs), problem
        super().__init__(
            f"the reference outputs of shape {shape} cannot tell a right model from a wrong "
            f"one: {problem}. Give inputs that exercise the model (--reference-inputs FILE, "
            "or example_input() in the model file: a detector needs a real image), or pass "
            "--allow-constant-references to build anyway (the load then warns that its "
            "self-test proves nothing for these outputs)")


class PaddingError(QkanPackError, ValueError):
    """A ``--pad`` declaration build cannot prove: padding ``input`` along ``dim`` changes
    ``output`` (sliced back) by ``max_rel`` of its scale, beyond ``tolerance``; or the
    declaration itself is unusable (``max_rel`` None, ``problem`` says why)."""

    def __init__(self, *, problem: str, input: str | None = None, dim: int | None = None,
                 output: str | None = None, max_rel: float | None = None,
                 tolerance: float | None = None, cause: str = "") -> None:
        self.problem, self.input, self.dim = problem, input, dim
        self.output, self.max_rel, self.tolerance = output, max_rel, tolerance
        super().__init__(f"cannot pad: {problem}" + _then(". ", cause)
                         + "; nothing was written")


class InputFileError(QkanPackError, ValueError):
    """A file of inputs that cannot be used (``build --reference-inputs``, ``predict
    --input``; ``predict --output`` too): ``path`` as given and what is wrong."""

    def __init__(self, *, path: str, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"{path}: {problem}")


class WeightsMismatchError(QkanPackError, ValueError):
    """Weights (from ``source``) that do not fit the model exactly; ``problems`` lists every
    key that does not."""

    def __init__(self, *, source: str, problems: Sequence[str] = (), reason: str = "") -> None:
        self.source = source
        self.problems = tuple(problems)
        super().__init__(f"weights from {source} do not fit the model:\n  "
                         + "\n  ".join(self.problems) if self.problems
                         else f"weights from {source}: {reason}")


class SelfTestError(QkanPackError, RuntimeError):
    """Outputs that disagree with eager execution or the build-time references: for shape
    ``shape``, by up to ``max_abs`` (``max_rel`` of the output's scale) beyond ``tolerance``
    ``(rtol, atol)``; or ``problem``, a structural difference no tolerance could accept."""

    def __init__(self, *, shape: str, compared: str, max_abs: float,
                 tolerance: tuple[float, float], hint: str, max_rel: float | None = None,
                 problem: str | None = None) -> None:
        self.shape, self.compared, self.max_abs, self.max_rel = shape, compared, max_abs, max_rel
        self.tolerance, self.problem = tuple(tolerance), problem
        rtol, atol = self.tolerance
        if problem is not None:
            super().__init__(f"self-test failed for shape {shape}: {compared} differ: "
                             f"{problem}; {hint}")
            return
        relative = f", {max_rel:.3g} of the output's scale" if max_rel is not None else ""
        super().__init__(
            f"self-test failed for shape {shape}: {compared} differ by up to {max_abs:.3g}"
            f"{relative} (rtol={rtol:g}, atol={atol:g} x scale). {hint}"
        )


class PrecisionError(SelfTestError):
    """A reduced precision that moves outputs further from the float32 references than the
    artifact's ``max_error`` (a share of each output's scale), measured at build (``device``
    the build host) or at load on the loading device; or, with ``problem`` set, a precision
    that cannot run there at all (``measured`` None).

    ``figures`` lists every output beyond the bound as ``(shape, output, measured)``;
    ``output``/``measured``/``shape`` are the worst of them. ``build_measured`` is what build
    recorded for that shape (None: not recorded, or at build itself).
    """

    def __init__(self, *, precision: str, device: str, max_error: float,
                 figures: Sequence[tuple[str, str, float]] = (), max_abs: float = float("inf"),
                 build_measured: float | None = None, problem: str | None = None,
                 hint: str = "") -> None:
        self.precision = precision
        self.device = device
        self.max_error = max_error
        self.figures = tuple(figures)
        worst: tuple[str, str | None, float | None] = max(self.figures, key=lambda f: f[2],
                                                           default=("", None, None))
        self.shape, self.output, self.measured = worst
        self.build_measured = build_measured
        self.compared = f"{precision} outputs on {device} and the float32 references"
        self.max_abs = max_abs
        self.max_rel = self.measured
        self.tolerance = (0.0, max_error)
        self.problem = problem
        if problem is not None:
            message = f"precision {precision} refused on {device}: {problem}"
        else:
            each = "; ".join(f"{output} {_precision_difference(measured, max_error)} (shape {shape})"
                             for shape, output, measured in self.figures)
            built = ("" if build_measured is None
                     else f"; build measured {build_measured:.2g} for shape {self.shape}")
            message = f"{precision} on {device}: {each}{built}"
        QkanPackError.__init__(self, message + _then(". ", hint))


def _precision_difference(measured: float, max_error: float) -> str:
    if measured == float("inf"):
        return ("differs beyond any bound (NaN/inf, or a non-float output that changed) > "
                f"{max_error:.2g}")
    return f"differs by {measured:.2g} of its scale > {max_error:.2g}"


class CaptureError(QkanPackError, RuntimeError):
    """A CUDA graph that could not be captured under the requested policy.

    ``shape`` is the manifest shape, ``module`` the submodule path (None for the whole
    model), ``op`` what broke the capture (an exception summary or an aten op).
    """

    def __init__(self, op: str, *, shape: str | None = None, module: str | None = None,
                 hint: str = "") -> None:
        self.op, self.shape, self.module, self.hint = op, shape, module, hint
        where = [text for text, value in ((f"submodule {module}", module),
                                          (f"shape {shape}", shape)) if value is not None]
        prefix = f"capture failed for {' '.join(where)}: " if where else ""
        super().__init__(prefix + op + _then(". ", hint))


class DeviceError(QkanPackError, RuntimeError):
    """A device that does not exist or cannot be used here: ``requested`` (as given),
    ``problem``, and ``suggestion`` (a device that would work, or None)."""

    def __init__(self, *, requested: str, problem: str, suggestion: str | None = None,
                 usage: bool = False) -> None:
        self.requested = requested
        self.problem = problem
        self.suggestion = suggestion
        self.usage = usage  # the text itself is malformed (a usage error on the CLI)
        super().__init__(f"device {requested!r}: {problem}"
                         + _then("; use device ", repr(suggestion) if suggestion else ""))


class KernelCacheError(QkanPackError, RuntimeError):
    """A shipped kernel set that cannot be stored or used."""


class BenchError(QkanPackError, RuntimeError):
    """A benchmark that cannot run as asked (bad settings, missing plotting library)."""


class OptionError(QkanPackError, ValueError):
    """A Python API argument outside its domain (``build(dtype=...)``, ``Predictor.load``
    options), refused before anything is read or run.

    ``option`` is the parameter name, ``value`` what was given, ``expected`` what is accepted.
    """

    def __init__(self, *, option: str, value: Any, expected: str) -> None:
        self.option = option
        self.value = value
        self.expected = expected
        super().__init__(f"option {option}={reprlib.repr(value)}: {expected}")


class LoadOptionError(OptionError):
    """A ``Predictor.load`` option outside its domain, refused before the artifact is read."""


class ServeError(QkanPackError, RuntimeError):
    """``qkan-pack serve`` cannot start or keep serving as asked (``problem``: a taken port,
    options out of range, replicas the cluster cannot place or that failed to load, a replica
    made unhealthy by a device error; ``hint``: the fix)."""

    def __init__(self, problem: str, *, hint: str = "") -> None:
        self.problem = problem
        self.hint = hint
        super().__init__(problem + _then("; ", hint))


class OverloadedError(ServeError):
    """A replica's admission is full: ``ongoing`` requests at work and ``queued`` waiting.
    The HTTP layer answers it with a JSON 503 and ``Retry-After``."""

    def __init__(self, *, ongoing: int, queued: int) -> None:
        self.ongoing, self.queued = ongoing, queued
        super().__init__(f"overloaded: {ongoing} requests at work and {queued} waiting",
                         hint="retry after Retry-After seconds")


class PlacementError(ServeError):
    """Replicas the cluster cannot place, refused before any is deployed: ``replicas`` by
    what they serve ("": one artifact; else a model or a model version), each asking
    ``each`` of ``kind`` (CPU, GPU; None: not one figure for all), ``need`` in all, where the
    cluster has ``have`` (``left``: left beside what serves); ``hint``: what to lower."""

    def __init__(self, *, kind: str, replicas: Mapping[str, int], need: float, have: float,
                 each: float | None = None, left: bool = False, hint: str = "") -> None:
        self.kind, self.replicas, self.need, self.have = kind, dict(replicas), need, have
        self.each, self.left = each, left
        named = ", ".join(f"{what}: {count}" for what, count in self.replicas.items() if what)
        super().__init__(f"cannot place {sum(self.replicas.values())} replicas"
                         + (f" x {each:g} {kind}" if each is not None else "")
                         + (f" ({named})" if named else "")
                         + (f": they need {need:g} {kind}" if named or each is None else "")
                         + f"; this cluster has {have:g}" + (" left" if left else ""), hint=hint)


class ReplicaLoadError(ServeError):
    """A replica that cannot load the artifact on the Ray node it was placed on: the path
    missing or another copy there, a package its model imports missing there, a device the
    node lacks. Named by the node's address and id, since on a cluster one node can fail
    where the others load; ``reason`` is the load's own error (kept as ``__cause__``)."""

    def __init__(self, *, node_ip: str | None, node_id: str | None, path: str,
                 reason: str, hint: str = "") -> None:
        self.node_ip, self.node_id, self.path, self.reason = node_ip, node_id, path, reason
        where = f"node {node_ip} (id {node_id})" if node_id else "this node"
        super().__init__(f"the replica on {where} cannot load the artifact at {path}: {reason}",
                         hint=hint)


class ServeTokenError(ServeError, ValueError):
    """A bearer token ``serve`` cannot use, or a token file it will not read: ``source`` is
    the file or the environment variable it came from, ``problem`` what is wrong with it and
    how to fix it."""

    def __init__(self, *, source: str, problem: str) -> None:
        self.source = source
        super().__init__(f"{source} {problem}")
        self.problem = problem


class RepositoryError(ServeError, ValueError):
    """A model repository (``serve REPO``: ``REPO/<name>/<version>/``) that cannot serve as
    laid out, or a model in it that cannot load: ``path`` is the repository (or the model's
    directory), ``problems`` each thing wrong, as ``<name>/<version>: what`` where it concerns
    one version. All are reported at once, so one pass fixes them."""

    def __init__(self, *, path: str, problems: Sequence[str], hint: str = "") -> None:
        self.path = path
        self.problems = tuple(problems)
        count = len(self.problems)
        super().__init__(f"model repository {path}: " + ("; ".join(self.problems) if count
                         else "nothing wrong was named"), hint=hint)


class InputError(QkanPackError, ValueError):
    """A predictor input outside what the artifact accepts.

    ``accepted`` lists the input signatures the artifact takes, each a mapping of input
    name to ``(shape, dtype)``; for an artifact with declared padding, ``ranges`` lists per
    entry what a call may send: per input ``{"dtype", "dims": [[low, high], ...]}``
    (inclusive). The message shows them, callers read the data.

    A call whose shapes no entry takes also carries the fix (``format.shape_fix``):
    ``given``, the call's shapes by input name; ``largest_batch``, set when the call only
    has more rows than the largest declared batch (split it); else ``pad_inputs``, the
    inputs ``--pad`` would pad when padding could hold the call (empty otherwise), and the
    shapes to declare at build (the accepted ones and ``given``; ``by_name``: as
    ``--input NAME:SHAPES`` rather than ``--shapes``).
    """

    def __init__(self, problem: str, *,
                 accepted: Sequence[Mapping[str, tuple[tuple[int, ...], str]]] = (),
                 padded: bool = False, ranges: Sequence[Mapping[str, Any]] = (),
                 given: Mapping[str, tuple[int, ...]] | None = None,
                 largest_batch: int | None = None, pad_inputs: Sequence[str] = (),
                 by_name: bool = False) -> None:
        self.problem = problem
        self.accepted = tuple(accepted)
        self.padded = padded
        self.ranges = tuple(ranges)
        self.given = None if given is None else {k: tuple(v) for k, v in given.items()}
        self.largest_batch = largest_batch
        self.pad_inputs = tuple(pad_inputs)
        self.by_name = by_name
        from ._accepted import format_accepted, format_ranges  # on a refusal only

        message = problem
        if self.ranges:
            message += f"; accepted: {format_ranges(self.ranges)}"
        elif self.accepted:
            message += f"; accepted: {format_accepted(self.accepted, padded=padded)}"
        if self.given is not None:
            message += f"; to run it, {self._fix()}"
        super().__init__(message)

    def with_problem(self, problem: str) -> InputError:
        """The same refusal (every field kept) saying ``problem`` instead."""
        return InputError(problem, accepted=self.accepted, padded=self.padded,
                          ranges=self.ranges, given=self.given,
                          largest_batch=self.largest_batch, pad_inputs=self.pad_inputs,
                          by_name=self.by_name)

    def _fix(self) -> str:
        if self.largest_batch is not None:
            return f"split the batch: the largest declared is {self.largest_batch}"
        fix = f"declare its shape at build: {self._declare()}"
        if self.given and self._lacks_batch_dim():
            one = "x".join(map(str, (1, *next(iter(self.given.values())))))
            fix = (f"add the batch dimension (one row is a batch of one: {one}, [[...]] in "
                   f"JSON, x[None] in Python); or {fix}")
        if self.pad_inputs:
            positional = self.given is not None and len(self.given) == 1 and not self.by_name
            pads = " ".join(f"--pad {'x' if positional else name}=0" for name in self.pad_inputs)
            fix += (f"; or let smaller calls be padded: build with {pads} (0: the value padded "
                    "positions take; build proves the model ignores them, or refuses)")
        return fix

    def _lacks_batch_dim(self) -> bool:
        """Whether the call is a declared signature's row without its batch dimension (one
        row sent as ``[1, 2, 3, 4]`` where the artifact takes ``Nx4``)."""
        assert self.given is not None
        return any(signature.keys() == self.given.keys() and all(
            tuple(signature[n][0][1:]) == shape and len(signature[n][0]) == len(shape) + 1
            for n, shape in self.given.items()) for signature in self.accepted)

    def _declare(self) -> str:
        """The build option declaring the accepted shapes and the given one."""
        assert self.given is not None
        entries = [tuple(tuple(signature[n][0]) for n in self.given) for signature in
                   self.accepted if signature.keys() == self.given.keys()]
        entries = list(dict.fromkeys([*entries, tuple(self.given.values())]))  # paired by entry
        shapes = {name: ",".join("x".join(map(str, entry[i])) for entry in entries)
                  for i, name in enumerate(self.given)}
        if len(shapes) == 1 and not self.by_name:
            return f"--shapes {next(iter(shapes.values()))}"
        return " ".join(f"--input {name}:{text}" for name, text in shapes.items())


class MalformedRequestError(InputError):
    """A serve request body that is not the request format at all (HTTP 400, unlike 422)."""


class PredictorClosedError(InputError):
    """A call made after ``close()``, or that lost the race with one (``path``: the artifact)."""

    def __init__(self, *, path: str) -> None:
        self.path = path
        super().__init__(f"this predictor of {path} is closed; load the artifact again")
