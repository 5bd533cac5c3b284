"""``build()``: import a user's model file, load its weights, record references, write an artifact.

``build`` reads as its phases: declare the shapes, import the model, declare its inputs,
record the references, prove padding and row independence, gate a reduced precision, write.
Each phase is a function here taking and returning small records (``_Inputs``,
``_Recorded``); the options are one ``BuildOptions`` (``_options``), checked before any phase.

Builds are reproducible: the same model file content, weights, shapes and options give the
same artifact digest whatever the directory, time or machine name (nothing time- or
path-dependent enters the manifest)."""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelSourceError, OptionError
from ..format import (
    MANIFEST_NAME,
    REFERENCE_DIR,
    SOURCE_DIR,
    WEIGHTS_NAME,
    InputDecl,
    Manifest,
    Metadata,
    ModelInfo,
    Padding,
    PadValue,
    PrecisionPolicy,
    ShapeEntry,
    check_range,
    input_batch,
    parse_shapes,
    with_batch_sizes,
)
from ..runtime import (
    ChannelPool,
    accepts_device,
    bind_forward,
    call_factory,
    channels_last_applies,
    check_entry_named,
    describe_output,
    entry_function,
    flatten,
    float64_forward,
    float64_noise,
    import_model_source,
    load_strict,
    model_solvers,
    package_versions,
    progress_bar,
    referenced_modules,
    resolve_output_classes,
)
from ._channels import pool_channels
from ._checks import (
    Recipe,
    ReferenceRun,
    RepeatedRun,
    buffers_before_forward,
    check_informative,
    check_reproducible,
    check_stateless,
)
from ._given import Given, given_of_shape, read_calibration, read_reference_inputs
from ._inputs import (
    EXAMPLE_INPUT_HOOK,
    DeclaredInputs,
    ShapesArg,
    declare_inputs,
    integer_ranges,
    reference_inputs,
)
from ._labels import check_labels_fit, checked_class_labels, unread_labels_notes
from ._options import BuildOptions
from ._packages import model_packages
from ._padding import Reference, declare_padding, pad_names
from ._precision import CalibrationSample, GateSample, gate_precision
from ._references import reference_bytes, run_reference
from ._row_proof import RowContext, prove_rows
from ._weights import check_storable, read_user_weights, tied_groups, weights_bytes
from ._writer import write_artifact


@dataclass(frozen=True)
class BuildResult:
    """Where the artifact went, its manifest and digest, and notes the user should read
    (e.g. an integer input whose range could not be inferred)."""

    path: Path
    manifest: Manifest
    digest: str
    notes: tuple[str, ...] = field(default=())


def build(model_path: str | Path, shapes: ShapesArg, *, options: BuildOptions | None = None,
          **keywords: Any) -> BuildResult:
    """Package ``model_path`` into an artifact directory and return where it went.

    ``shapes`` is ``"1x128,8x128"`` or a list of shapes (one input, passed positionally), or
    a list of ``{input_name: shape}`` dicts (named inputs, passed to forward by keyword);
    with ``batch_sizes``, per-row shapes (``"128"``, ``[{"input_ids": (128,)}]``) declared
    at every batch size (``format.with_batch_sizes``). All inputs of all declared shapes
    together may take at most ``format.MAX_REFERENCE_BYTES`` (1 GiB).

    The options are one ``BuildOptions`` or its fields as keywords (``output=``, ``pad=``,
    ``precision=``...; an unknown keyword is a ``TypeError`` listing them), all checked
    before the model file is imported.

    The build runs in phases: declare the shapes, import the model, declare its inputs
    (checked against ``forward``), record the references (``_checks``: informative, a
    reproducible factory), prove what serving relies on (padding leaves the outputs
    unchanged, ``builder._padding``, else ``PaddingError``; which shapes' rows are
    independent, ``builder._row_proof``), gate a reduced precision against the float32
    outputs (``PrecisionError`` beyond ``max_error``), write the artifact atomically.
    """
    options = _options_of(options, keywords)
    model_path = _model_file(model_path)
    shapes = _declared_shapes(shapes, options.batch_sizes)
    user = _import_model(model_path, options)
    metadata = dataclasses.replace(options.metadata(model_path),
                                   class_labels=checked_class_labels(user.model))
    inputs = _declare_inputs(user, shapes, options, model_path)
    files = {**user.sources, WEIGHTS_NAME: weights_bytes(user.model, user.tied)}
    recorded = _pool_channels(_record_references(user, inputs, files, options), inputs)
    recorded = dataclasses.replace(recorded, notes=recorded.notes + unread_labels_notes(user.model))
    check_labels_fit(metadata.class_labels, recorded.entries)
    _check_stateless(recorded, inputs, user.model)
    recorded = _prove(recorded, inputs, user.model, options.progress)
    recorded = _gate_precision(recorded, inputs, options, user.model)
    return _write(_Built(user, metadata, inputs, recorded, files), options)


def _options_of(options: BuildOptions | None, keywords: Mapping[str, Any]) -> BuildOptions:
    if options is None:
        return BuildOptions.from_keywords(keywords)
    if keywords:
        raise TypeError("pass either options=BuildOptions(...) or keywords, not both")
    if not isinstance(options, BuildOptions):
        raise OptionError(option="options", value=options, expected="a BuildOptions")
    return options


def _model_file(model_path: Any) -> Path:
    """The model file's path; anything else (a module object most often) is an
    ``OptionError`` saying what build takes."""
    if isinstance(model_path, (str, os.PathLike)):
        return Path(model_path)
    what = type(model_path).__name__
    hint = (" (an nn.Module): write a model file whose build_model() returns it, and build "
            "that file" if isinstance(model_path, torch.nn.Module) else "")
    raise OptionError(option="model_path", value=model_path,
                      expected=f"the path of a .py file defining build_model(), not a {what}"
                               + hint)


def _declared_shapes(shapes: ShapesArg, batch_sizes: Sequence[int] | None) -> ShapesArg:
    """``shapes``, or with ``batch_sizes`` every per-row shape at every batch size."""
    if batch_sizes is None:
        return shapes
    return with_batch_sizes(parse_shapes(shapes) if isinstance(shapes, str) else shapes,
                            batch_sizes)


def _producer(*, uses_qkan: bool) -> dict[str, Any]:
    """Versions that shape the references; no host name or kernel release, which would
    make the same build differ from machine to machine, and qkan only for a model that
    imports it (a plain torch model's digest does not depend on whether qkan is installed,
    and its load does not warn about a qkan it never uses)."""
    versions = package_versions()
    versions.pop("platform", None)
    if not uses_qkan:
        versions.pop("qkan", None)
    return {**versions, "system": platform.system(), "machine": platform.machine()}


def _unresolved_output_classes(entries: Sequence[ShapeEntry], user: _UserModel) -> list[str]:
    """Output classes a load will not look up (defined outside what the model source and
    its model refer to), said at build rather than discovered at load."""
    return resolve_output_classes([entry.outputs for entry in entries],
                                  partial(referenced_modules, user.module, user.model))[1]


def _unmeasured_noise_note(entries: Sequence[ShapeEntry]) -> tuple[str, ...]:
    """Said at build: shapes whose self-test falls back to the fixed tolerance, which a
    small re-signed weight edit can pass."""
    missing = [entry.label for entry in entries if entry.noise is None]
    if not missing:
        return ()
    return (f"float32 noise not measured for shape(s) {', '.join(missing)} (a float64 copy "
            "of the model could not be made or run, e.g. an op without float64 or float32 "
            "tensors outside its parameters and buffers, or it still computed an output in "
            "float32): their load self-test uses the fixed tolerance, looser than a noise "
            "bound; pin the digest or sign the artifact",)


def _range_note(decl: InputDecl) -> str:
    return (f"integer input {decl.name!r}: no embedding reads it directly, so reference values "
            f"were drawn from [{decl.low:g}, {decl.high:g}); if it takes other values (token "
            "ids, positions), rebuild with --input-range LOW,HIGH or define example_input() "
            "in the model file")


@dataclass(frozen=True)
class _Sources:
    """Where reference inputs come from: the model file's ``example_input`` hook, the user's
    ``--reference-inputs`` arrays, and the seed of the random ones."""

    hook: Any
    given: Given | None
    seed: int


#: Fresh inputs for the row proof are drawn with the reference seed moved by this much (and
#: the entry's index), far from any seed a reference of this build used. Its low 32 bits
#: matter: torch's CPU generator seeds from them (2**62 would draw the references again).
FRESH_SEED_OFFSET = 0x9E3779B97F4A7C15 % 2**63
#: ... and those of the draws that show each output channel's scale (``_Inputs.draw``).
CHANNEL_SEED_OFFSET = 0x632BE59BD9B4E019 % 2**63


@dataclass(frozen=True)
class _Inputs:
    """The declared inputs, checked against the model: names, call convention and shapes
    (``declared``), each input's declaration with its value range (``decls``), the model's
    forward bound to them, where reference values come from, the ``--pad`` values by input
    name, and the ``--calibration`` samples (entry, inputs in declared order, name)."""

    declared: DeclaredInputs
    decls: list[InputDecl]
    forward: Any
    sources: _Sources
    padded: dict[str, PadValue]
    calibrating: list[tuple[int, list[torch.Tensor], str]]
    model_path: Path

    def reference(self, index: int) -> dict[str, torch.Tensor]:
        """Entry ``index``'s reference inputs: the user's where they fit, else the
        ``example_input`` hook's, else drawn at random."""
        sources = self.sources
        return reference_inputs(self.declared.per_shape[index], self.decls,
                                sources.seed + index, sources.hook, self.model_path,
                                sources.given)

    def fresh(self, index: int, reference: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Another draw of entry ``index``'s inputs (declared order): the other clients' rows
        of the row proof, and what ``check_stateless`` runs. From the ``example_input`` hook
        with another seed, else (or where the hook gives an input of ``reference`` again: a
        hook that repeats one sample would make the proof's runs change nothing) at random
        within each input's range. Never the user's ``--reference-inputs``, which hold one
        batch per shape."""
        seed = self.sources.seed + FRESH_SEED_OFFSET + index
        drawn = self._drawn(index, seed, self.sources.hook)
        if any(torch.equal(a, b) for a, b in zip(drawn, reference)):
            drawn = self._drawn(index, seed, None)
        return drawn

    def draw(self, index: int, draw: int) -> list[torch.Tensor]:
        """Draw number ``draw`` (1, 2, ...) of entry ``index``'s inputs (declared order) beyond
        its reference: the ``example_input`` hook's with another seed, else at random within
        each input's range (``_pool_channels``: rows that show each channel's scale)."""
        return self._drawn(index, self.sources.seed + CHANNEL_SEED_OFFSET * draw + index,
                           self.sources.hook)

    def _drawn(self, index: int, seed: int, hook: Any) -> list[torch.Tensor]:
        """Entry ``index``'s inputs (declared order) from ``hook`` or at random, at ``seed``."""
        return list(reference_inputs(self.declared.per_shape[index], self.decls, seed % 2**63,
                                     hook, self.model_path).values())

    def run(self, index: int, inputs: Mapping[str, torch.Tensor]) -> Any:
        """The model's float32 outputs on entry ``index``'s ``inputs`` (``run_reference``'s
        checks included)."""
        declared = self.declared
        return run_reference(self.forward, inputs, declared.per_shape[index], self.model_path,
                             declared.dtypes)

    def flat_outputs(self, index: int, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """A calibration sample's float32 outputs, flat."""
        return flatten(self.run(index, dict(zip(self.declared.names, inputs))))


def _declare_inputs(user: _UserModel, shapes: ShapesArg, options: BuildOptions,
                    model_path: Path) -> _Inputs:
    """The inputs matched to ``forward``'s signature, their value ranges, the pad values by
    input, and the user's input files read against them (before any reference runs)."""
    declared = declare_inputs(shapes, options.dtype_names, user.model)
    forward = bind_forward(user.model, declared.names, declared.call)
    hook = getattr(user.module, EXAMPLE_INPUT_HOOK, None)
    input_range = check_range(options.input_range, list(declared.dtypes.values()))
    decls = integer_ranges(declared, forward, user.model, input_range, hook)
    padded = pad_names(options.pad, declared.names, declared.call) if options.pad else {}
    given = (read_reference_inputs(Path(options.reference_inputs), declared.dtypes,
                                   declared.per_shape)
             if options.reference_inputs is not None else None)
    calibrating = (read_calibration(Path(options.calibration), declared.dtypes,
                                    declared.per_shape)
                   if options.calibration is not None else [])
    return _Inputs(declared, decls, forward, _Sources(hook, given, options.seed), padded,
                   calibrating, model_path)


@dataclass(frozen=True)
class _Recorded:
    """What the build has established per declared entry so far: the entries, their
    reference runs (inputs and flat outputs: what padding and rows are proven on), notes
    for the user, and once proven and gated, the padding and the precision policy."""

    entries: list[ShapeEntry]
    references: list[Reference]
    notes: list[str]
    padding: Padding | None = None
    precision: PrecisionPolicy | None = None
    #: Per entry, its outputs' channel scales (``_pool_channels``).
    channels: tuple[ChannelPool, ...] = ()


def _record_references(user: _UserModel, inputs: _Inputs, files: dict[str, bytes],
                       options: BuildOptions) -> _Recorded:
    """Run the model once per declared shape; add each reference file to ``files``; check
    that the references can tell a wrong model from this one and that the factory rebuilds
    this model (``_checks``); then measure each reference's rounding noise, which sets how
    far a load may drift from it (``runtime.float64_noise``)."""
    declared = inputs.declared
    entries, samples, outputs, notes = [], [], [], []
    for index in progress_bar(range(len(declared.per_shape)), desc="reference outputs",
                              enabled=options.progress):
        reference = f"{REFERENCE_DIR}/shape-{index:03d}.safetensors"
        values = inputs.reference(index)
        result = inputs.run(index, values)
        files[reference] = reference_bytes(values, result)
        entry = ShapeEntry(tuple(declared.per_shape[index].items()), describe_output(result),
                           reference)
        notes += check_informative(entry.label, flatten(result), list(entry.outputs.leaf_names()),
                                   allow=options.allow_constant_references)
        entries.append(entry)
        samples.append(list(values.values()))
        outputs.append(flatten(result))
    if inputs.sources.given is not None:
        notes += _ungiven_note(entries, inputs.sources.given)
    check_reproducible(user.buffers, user.recipe(files[WEIGHTS_NAME], inputs.model_path),
                       RepeatedRun(partial(bind_forward, names=declared.names, call=declared.call),
                                   samples[0], outputs[0], list(entries[0].outputs.leaf_names())))
    noises = float64_noise(user.model, declared.names, declared.call, samples, outputs,
                           progress=options.progress)
    entries = [dataclasses.replace(entry, noise=noise) for entry, noise in zip(entries, noises)]
    references = [Reference(entry, sample, flat)
                  for entry, sample, flat in zip(entries, samples, outputs)]
    return _Recorded(entries, references, notes)


def _prove(recorded: _Recorded, inputs: _Inputs, model: torch.nn.Module,
           progress: bool | None) -> _Recorded:
    """Prove what serving relies on: with ``--pad``, that padding leaves the outputs
    unchanged (``_padding``, else ``PaddingError``); for each entry with a batch axis, whether
    its rows are independent (``_row_proof``: serve batches only those; rows alone are
    compared in float64 too, with a float64 copy of ``model`` freed afterwards)."""
    padding = declare_padding(
        inputs.padded, inputs.decls, recorded.references, inputs.forward,
        progress=lambda items: progress_bar(items, desc="proving padding", enabled=progress),
    ) if inputs.padded else None
    declared = inputs.declared
    batched = any((input_batch(r.entry) or 0) >= 2 for r in recorded.references)
    context = RowContext(inputs.forward, declared.names, padding, inputs.fresh,
                         recorded.channels,
                         float64_forward(model, declared.names, declared.call) if batched else None)
    proofs = prove_rows(recorded.references, context, progress=lambda items: progress_bar(
        items, desc="proving rows independent", enabled=progress))
    del context
    entries = [dataclasses.replace(entry, rows=proof)
               for entry, proof in zip(recorded.entries, proofs)]
    references = [dataclasses.replace(reference, entry=entry)
                  for reference, entry in zip(recorded.references, entries)]
    return dataclasses.replace(recorded, entries=entries, references=references,
                               notes=recorded.notes + _dependent_rows_notes(entries),
                               padding=padding)


def _pool_channels(recorded: _Recorded, inputs: _Inputs) -> _Recorded:
    """The references' channel scales, with more draws where a batch is too small to show
    them (``_channels.pool_channels``)."""
    calibration = [(index, sample) for index, sample, _ in inputs.calibrating]
    pools, notes = pool_channels(recorded.references, calibration, inputs.draw,
                                 inputs.flat_outputs)
    return dataclasses.replace(recorded, channels=pools, notes=recorded.notes + notes)


def _check_stateless(recorded: _Recorded, inputs: _Inputs, model: torch.nn.Module) -> None:
    """The model answers the same after running other inputs (``_checks.check_stateless``),
    checked at every declared entry (a state may move at one batch size only)."""
    for index, reference in enumerate(recorded.references):
        run = ReferenceRun(inputs.forward, reference.inputs, reference.outputs,
                           list(reference.entry.outputs.leaf_names()), reference.entry.noise,
                           inputs.fresh(index, reference.inputs))
        check_stateless(model, run, str(inputs.model_path))


def _dependent_rows_notes(entries: Sequence[ShapeEntry]) -> list[str]:
    """Said at build: the entries serve will not batch requests into, and why."""
    return [f"shape {entry.label}: rows are not independent, so serve replays each request "
            f"in it alone ({entry.rows.detail})"
            for entry in entries if entry.rows is not None and not entry.rows.independent]


def _gate_precision(recorded: _Recorded, inputs: _Inputs, options: BuildOptions,
                    model: torch.nn.Module) -> _Recorded:
    """A reduced precision's outputs on the references and the ``--calibration`` samples
    within ``max_error`` of the float32 ones (``_precision.gate_precision``), recorded per
    entry, with the layouts a load may capture in (channels-last too for a model with a 2-D
    convolution); float32 passes unchanged."""
    if options.precision == "fp32":
        return recorded
    samples: list[GateSample | CalibrationSample] = [
        GateSample(index, ref.inputs, ref.outputs) for index, ref in enumerate(recorded.references)]
    samples += [CalibrationSample(index, sample, partial(inputs.flat_outputs, index, sample),
                                  f"--calibration {options.calibration}, {label}")
                for index, sample, label in inputs.calibrating]
    gated, entries, notes = gate_precision(inputs.forward, recorded.entries, samples,
                                           options.precision, options.max_error or 0.0,
                                           channels_last=channels_last_applies(model),
                                           pools=recorded.channels)
    return dataclasses.replace(recorded, entries=entries, notes=recorded.notes + notes,
                               precision=gated)


@dataclass(frozen=True)
class _Built:
    """Everything the artifact is written from."""

    user: _UserModel
    metadata: Metadata
    inputs: _Inputs
    recorded: _Recorded
    files: dict[str, bytes]


def _write(built: _Built, options: BuildOptions) -> BuildResult:
    """The manifest, the artifact written atomically (``write_artifact``), and the notes,
    also emitted as warnings."""
    user, inputs, recorded = built.user, built.inputs, built.recorded
    info = user.info()
    manifest = Manifest(
        producer=_producer(uses_qkan="qkan" in info.packages), model=info,
        call=inputs.declared.call, inputs=tuple(inputs.decls), shapes=tuple(recorded.entries),
        capture=options.capture_policy, files={}, reference_device="cpu",
        reference_precision=torch.get_float32_matmul_precision(), metadata=built.metadata,
        padding=recorded.padding, precision=recorded.precision,
    )
    target = (Path(options.output) if options.output is not None
              else Path("artifacts") / inputs.model_path.stem)
    final, digest = write_artifact(target, manifest, built.files, force=options.force,
                                  protect=(inputs.model_path.parent,))
    notes = tuple(_range_note(d) for d in inputs.decls if d.range_source == "default")
    notes += tuple(recorded.notes)
    notes += tuple(_unresolved_output_classes(recorded.entries, user))
    notes += _unmeasured_noise_note(recorded.entries)
    for note in notes:
        warnings.warn(note, stacklevel=3)
    return BuildResult(path=target, manifest=final, digest=digest, notes=notes)


def _ungiven_note(entries: Sequence[ShapeEntry], given: Given) -> list[str]:
    """Shapes for which --reference-inputs held no array: their inputs were drawn at random."""
    missing = [entry.label for entry in entries
               if any(given_of_shape(given, name, shape) is None for name, shape in entry.inputs)]
    if not missing:
        return []
    return [f"--reference-inputs holds no array for shape(s) {', '.join(missing)}: their "
            "reference inputs were drawn at random"]


@dataclass
class _UserModel:
    """The user's model file imported, its factory called, weights loaded, in eval mode."""

    source_name: str
    sources: dict[str, bytes]
    module: Any
    entry: str
    config: dict[str, Any]
    device_argument: bool
    model: torch.nn.Module
    tied: list[list[str]]
    buffers: dict[str, torch.Tensor]  # as the factory and weights left them (no forward yet)

    def info(self) -> ModelInfo:
        return ModelInfo(
            source=self.source_name,
            includes=tuple(p for p in sorted(self.sources) if p != self.source_name),
            entry=self.entry, config=self.config, device_argument=self.device_argument,
            parameters=sum(p.numel() for p in self.model.parameters()),
            tied=tuple(tuple(g) for g in self.tied),
            packages=model_packages(self.module, self.model),
            solvers=tuple(model_solvers(self.model)),
        )

    def recipe(self, weights: bytes, model_path: Path) -> Recipe:
        """How a load rebuilds this model, from the artifact's ``weights``."""
        return Recipe(module=self.module, entry=self.entry, config=self.config,
                      weights=weights, tied=self.tied, path=model_path)


def _import_model(model_path: Path, options: BuildOptions) -> _UserModel:
    """The model file (and ``includes``) imported as a load will, its factory called with
    ``config`` on the CPU, ``weights`` loaded strictly, in eval mode."""
    sources = _read_sources(model_path, options.includes)
    source_name = f"{SOURCE_DIR}/{model_path.name}"
    imported_before = set(sys.modules)
    module = import_model_source(source_name, sources, display_path=str(model_path))
    entry = options.entry
    factory = entry_function(module, entry, str(model_path))
    check_entry_named(entry, sources, str(model_path))  # the loader checks this before import
    model = call_factory(factory, dict(options.config), str(model_path), entry, device="cpu",
                         beside=os.path.dirname(model_path))
    _refuse_unpacked_neighbours(imported_before, model_path, sources)
    check_storable(model, str(model_path))
    tied = tied_groups(model)
    if options.weights is not None:
        load_strict(model, read_user_weights(Path(options.weights)), tied, str(options.weights))
    model.eval()  # after weights: QKAN folds masks/biases into eval-time caches here
    return _UserModel(source_name=source_name, sources=sources, module=module, entry=entry,
                      config=dict(options.config), device_argument=accepts_device(factory),
                      model=model, tied=tied, buffers=buffers_before_forward(model))


def _refuse_unpacked_neighbours(imported_before: set[str], model_path: Path,
                                sources: Mapping[str, bytes]) -> None:
    """A module the model imported from beside its file that is not packed: found at build
    only because the model's folder is on ``sys.path`` (``python -m qkan_pack`` or Python
    started there), it would be missing at every load. Refused, naming the ``--include``."""
    folder = model_path.resolve().parent
    packed = {(folder / name.removeprefix(f"{SOURCE_DIR}/")).resolve() for name in sources}
    for name in sorted(set(sys.modules) - imported_before):
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        if folder in path.parents and path not in packed and "site-packages" not in path.parts:
            relative = path.relative_to(folder)
            shown = relative.parent if relative.name == "__init__.py" else relative
            raise ModelSourceError(
                f"{model_path} imports {name!r} from {path}, beside the model, which the "
                f"artifact would not hold (it was found only because that folder is on "
                f"sys.path here): build with --include {shown.as_posix()}")


def _read_sources(model_path: Path, includes: Sequence[str | os.PathLike[str]]
                  ) -> dict[str, bytes]:
    """The model file plus includes, keyed by their path inside the artifact."""
    if not model_path.is_file():
        raise ModelSourceError(f"model file {model_path} does not exist")
    if model_path.suffix != ".py":
        raise ModelSourceError(f"model file {model_path} is not a .py file")
    base = model_path.resolve().parent
    sources = {f"{SOURCE_DIR}/{model_path.name}": model_path.read_bytes()}
    for include in includes:
        for file in _expand_include(Path(include), model_path):
            try:
                relative = file.resolve().relative_to(base).as_posix()
            except ValueError:
                raise ModelSourceError(
                    f"--include {file} is outside {base}; includes must sit beside the model file"
                ) from None
            sources[f"{SOURCE_DIR}/{relative}"] = file.read_bytes()
    return sources


def _inside_an_artifact(path: Path, top: Path) -> bool:
    """Whether ``path`` lies in an artifact built into the included folder ``top`` (its
    sources are that artifact's, not the package's: packing them would nest artifacts)."""
    return any((folder / MANIFEST_NAME).is_file() for folder in path.parents
               if folder != top and top in folder.parents)


def _expand_include(include: Path, model_path: Path) -> list[Path]:
    candidate = include if include.exists() else model_path.parent / include
    if candidate.is_dir():
        return sorted(p for p in candidate.rglob("*.py") if "__pycache__" not in p.parts
                      and not _inside_an_artifact(p, candidate))
    if candidate.is_file() and candidate.suffix == ".py":
        return [candidate]
    raise ModelSourceError(f"--include {include} is not a .py file or a directory of them")
