"""``build()``: import a user's model file, load its weights, record references, write an artifact.

Builds are reproducible: the same model file content, weights, shapes and options give the
same artifact digest whatever the directory, time or machine name (nothing time- or
path-dependent enters the manifest)."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..errors import ManifestError, ModelSourceError, OptionError, ShapeSpecError
from ..format import (
    CAPTURE_POLICIES,
    DEFAULT_VERSION,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    REFERENCE_DIR,
    SOURCE_DIR,
    WEIGHTS_NAME,
    CapturePolicy,
    InputDecl,
    Manifest,
    ModelInfo,
    Padding,
    PadValue,
    ShapeEntry,
    check_class_labels,
    check_config,
    check_metadata,
    check_range,
    check_seed,
    parse_shapes,
    with_batch_sizes,
)
from ..runtime import (
    accepts_device,
    bind_forward,
    call_factory,
    check_entry_named,
    describe_output,
    entry_function,
    flatten,
    float64_noise,
    import_model_source,
    load_strict,
    model_solvers,
    package_versions,
    progress_bar,
    referenced_modules,
    resolve_output_classes,
)
from ._checks import buffers_before_forward, check_informative, check_reproducible
from ._given import Given, given_of_shape, read_calibration, read_reference_inputs
from ._inputs import (
    EXAMPLE_INPUT_HOOK,
    DeclaredInputs,
    ShapesArg,
    declare_inputs,
    integer_ranges,
    reference_inputs,
)
from ._packages import model_packages
from ._padding import Reference, declare_padding, pad_names
from ._precision import CalibrationSample, GateSample, check_precision_options, gate_precision
from ._references import reference_bytes, run_reference
from ._row_proof import prove_rows
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


def build(
    model_path: str | Path,
    shapes: ShapesArg,
    *,
    output: str | Path | None = None,
    dtype: str | Mapping[str, str] = "float32",
    entry: str = "build_model",
    config: Mapping[str, Any] | None = None,
    weights: str | Path | None = None,
    includes: Sequence[str | Path] = (),
    capture: str = "auto",
    submodules: Sequence[str] = (),
    input_range: tuple[float, float] | None = None,
    seed: int = 0,
    reference_inputs: str | Path | None = None,
    allow_constant_references: bool = False,
    name: str | None = None,
    model_version: str = DEFAULT_VERSION,
    description: str = "",
    license: str = "",
    labels: Mapping[str, str] | None = None,
    batch_sizes: Sequence[int] | None = None,
    pad: Mapping[str, PadValue] | None = None,
    precision: str = "fp32",
    max_error: float | None = None,
    calibration: str | Path | None = None,
    force: bool = False,
    progress: bool | None = None,
) -> BuildResult:
    """Package ``model_path`` into an artifact directory and return where it went.

    ``shapes`` is ``"1x128,8x128"`` or a list of shapes (one input, passed positionally), or
    a list of ``{input_name: shape}`` dicts (named inputs, passed to forward by keyword).
    ``dtype`` is one dtype for every input or a ``{input_name: dtype}`` mapping.
    ``input_range`` (LOW, HIGH) draws random float reference inputs uniformly from
    [LOW, HIGH) and integer ones from [int(LOW), int(HIGH)); ``seed`` (0 to 2**63 - 1)
    seeds them. All inputs of all declared shapes together may take at most
    ``format.MAX_REFERENCE_BYTES`` (1 GiB).
    ``reference_inputs`` is an .npz/.npy/.safetensors file of inputs that exercise the model
    (arrays named after the inputs; ``builder._given``), used where they fit a declared
    shape. References with an empty output, or only constant ones, are refused
    (``WeakReferencesError``) unless ``allow_constant_references``.
    ``pad`` (``{"input_ids": 0, "attention_mask": 0}``; ``x`` for a single positional input)
    lets calls be smaller than a declared entry along every dimension in which the entries
    differ, padded with these values; build proves it leaves the outputs unchanged
    (``builder._padding``) or refuses with ``PaddingError``.
    With ``batch_sizes``, ``shapes`` are per-row shapes (``"128"``, ``[{"input_ids": (128,)}]``)
    and every one is declared at every batch size (``format.with_batch_sizes``).
    ``precision`` (``fp32``, ``tf32``, ``bf16``, ``fp16``, or ``auto``: every one that passes,
    float32 served until ``warm(precision="auto")`` chooses per device) is gated here: its
    outputs on the reference inputs and the ``calibration`` file's (.npz/.npy/.safetensors,
    arrays named as for ``reference_inputs``, one suffix per sample) must stay within
    ``max_error`` (default ``format.DEFAULT_MAX_ERROR``) of the float32 outputs, a share of
    each output's scale, else ``PrecisionError``; each load gates it again on its device.
    ``name`` (default: the model file's stem), ``model_version``, ``description``,
    ``license`` and ``labels`` describe the model (``format.Metadata``); a transformers
    classifier's ``id2label`` is recorded as its class labels.
    """
    model_path = _model_file(model_path)
    dtype = _dtype_names(dtype)
    policy = _capture_policy(capture, submodules)
    seed = check_seed(seed)  # before the model runs: torch takes seeds below 2**64 only
    precision, max_error = check_precision_options(precision, max_error)
    if calibration is not None and precision == "fp32":
        raise OptionError(option="calibration", value=str(calibration),
                          expected="no file with precision fp32 (calibration inputs measure a "
                                   "reduced precision: pass --precision)")
    metadata = check_metadata(name=_model_name(name, model_path), version=model_version,
                              description=description, license=license, labels=labels)
    if batch_sizes is not None:
        shapes = with_batch_sizes(parse_shapes(shapes) if isinstance(shapes, str) else shapes,
                                  batch_sizes)
    user = _load_user_model(model_path, includes, entry, check_config(config or {}), weights)
    metadata = dataclasses.replace(metadata, class_labels=_checked_class_labels(user.model))
    declared = declare_inputs(shapes, dtype, user.model)
    forward = bind_forward(user.model, declared.names, declared.call)
    hook = getattr(user.module, EXAMPLE_INPUT_HOOK, None)
    input_range = check_range(input_range, list(declared.dtypes.values()))
    decls = integer_ranges(declared, forward, user.model, input_range, hook)
    padded = pad_names(pad, declared.names, declared.call) if pad else {}
    files = {**user.sources, WEIGHTS_NAME: weights_bytes(user.model, user.tied)}
    given = (read_reference_inputs(Path(reference_inputs), declared.dtypes, declared.per_shape)
             if reference_inputs is not None else None)
    calibrating = (read_calibration(Path(calibration), declared.dtypes, declared.per_shape)
                   if calibration is not None else [])
    sources = _Sources(hook, given, seed)
    entries, reference_notes, references = _record_references(
        user, declared, decls, sources, model_path, files, progress,
        allow_constant=allow_constant_references)
    padding = declare_padding(
        padded, decls, references, forward,
        progress=lambda items: progress_bar(items, desc="proving padding", enabled=progress),
    ) if padded else None
    entries, references = _prove_rows(entries, references, forward, partial(
        _fresh_inputs, declared=declared, decls=decls, sources=sources, model_path=model_path),
        padding, progress)
    reference_notes += _dependent_rows_notes(entries)
    gated = None
    if precision != "fp32":
        samples = [GateSample(index, ref.inputs, ref.outputs)
                   for index, ref in enumerate(references)]
        samples += [CalibrationSample(index, inputs, partial(
            _flat_reference, forward, dict(zip(declared.names, inputs)),
            declared.per_shape[index], model_path, declared.dtypes),
            f"--calibration {calibration}, {label}") for index, inputs, label in calibrating]
        gated, entries, precision_notes = gate_precision(forward, entries, samples, precision,
                                                          max_error or 0.0)
        reference_notes += precision_notes
    info = user.info()
    manifest = Manifest(
        producer=_producer(uses_qkan="qkan" in info.packages), model=info, call=declared.call,
        inputs=tuple(decls),
        shapes=tuple(entries), capture=policy, files={}, reference_device="cpu",
        reference_precision=torch.get_float32_matmul_precision(), metadata=metadata,
        padding=padding, precision=gated,
    )
    target = Path(output) if output is not None else Path("artifacts") / model_path.stem
    final, digest = write_artifact(target, manifest, files, force=force,
                                  protect=(model_path.parent,))
    notes = tuple(_range_note(d) for d in decls if d.range_source == "default")
    notes += tuple(reference_notes)
    notes += tuple(_unresolved_output_classes(entries, user))
    notes += _unmeasured_noise_note(entries)
    for note in notes:
        warnings.warn(note, stacklevel=2)
    return BuildResult(path=target, manifest=final, digest=digest, notes=notes)


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


def _dtype_names(dtype: Any) -> str | dict[str, str]:
    """``dtype`` as names: a dtype name, a ``torch.dtype``, or a ``{input: either}`` mapping."""
    def one(value: Any, where: str) -> str:
        if isinstance(value, torch.dtype):
            return str(value).removeprefix("torch.")
        if isinstance(value, str):
            return value
        raise OptionError(option=where, value=value,
                          expected="a dtype name ('float32', 'int64') or a torch.dtype")

    if isinstance(dtype, Mapping):
        return {name: one(value, f"dtype[{name!r}]") for name, value in dtype.items()}
    return one(dtype, "dtype")


def _model_name(name: str | None, model_path: Path) -> str:
    """The given name, else the model file's stem made URL-safe (``my model.py``: my_model)."""
    if name is not None:
        return name
    return re.sub(r"[^A-Za-z0-9._-]", "_", model_path.stem).lstrip("._-")[:128] or "model"


def class_labels_of(model: torch.nn.Module) -> tuple[str, ...]:
    """A transformers classifier's class names, index order (``config.id2label``); none when
    the config has only the library's placeholders (``LABEL_0``...)."""
    id2label = getattr(getattr(model, "config", None), "id2label", None)
    if not isinstance(id2label, Mapping) or not id2label:
        return ()
    try:
        ordered = [str(id2label[i]) for i in range(len(id2label))]
    except KeyError:
        return ()
    if ordered == [f"LABEL_{i}" for i in range(len(ordered))]:
        return ()
    return tuple(ordered)


def _checked_class_labels(model: torch.nn.Module) -> tuple[str, ...]:
    """``class_labels_of``, checked as every metadata text is (``format.check_class_labels``)
    before the model runs: a manifest the reader refuses is never written. Labels that alone
    exceed the manifest's size limit are refused here too, rather than after every
    reference has run (the writer checks the whole manifest: ``readable_manifest``)."""
    try:
        labels = check_class_labels(class_labels_of(model), "the model's config.id2label")
        size = len(json.dumps(labels))
        if size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"the model's config.id2label: its {len(labels)} class labels "
                                f"take {size} bytes, more than the {MAX_MANIFEST_BYTES} bytes "
                                "a whole manifest may take")
    except ManifestError as exc:
        raise ManifestError(f"{exc}; the artifact records these as its class labels: fix "
                            "id2label in the model's config") from None
    return labels


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


def _flat_reference(forward: Any, inputs: Mapping[str, torch.Tensor], shape_map: Mapping[str, Any],
                    model_path: Path, dtypes: Mapping[str, str]) -> list[torch.Tensor]:
    """A calibration sample's float32 outputs, flat (``run_reference``'s checks included)."""
    return flatten(run_reference(forward, inputs, shape_map, model_path, dtypes))


def _record_references(user: _UserModel, declared: DeclaredInputs, decls: list[InputDecl],
                       sources: _Sources, model_path: Path, files: dict[str, bytes],
                       progress: bool | None, *, allow_constant: bool
                       ) -> tuple[list[ShapeEntry], list[str], list[Reference]]:
    """Run the model once per declared shape; add each reference file to ``files``; check
    that the references can tell a wrong model from this one and that the factory rebuilds
    this model (``_checks``); then measure each reference's rounding noise, which sets how
    far a load may drift from it (``runtime.float64_noise``). Returns the entries, notes, and
    each entry's reference run (what ``--pad`` is proven on)."""
    model = user.model
    forward = bind_forward(model, declared.names, declared.call)
    entries, samples, outputs, notes = [], [], [], []
    for index, shape_map in enumerate(
        progress_bar(declared.per_shape, desc="reference outputs", enabled=progress)
    ):
        reference = f"{REFERENCE_DIR}/shape-{index:03d}.safetensors"
        inputs = reference_inputs(shape_map, decls, sources.seed + index, sources.hook,
                                  model_path, sources.given)
        result = run_reference(forward, inputs, shape_map, model_path, declared.dtypes)
        files[reference] = reference_bytes(inputs, result)
        entry = ShapeEntry(tuple(shape_map.items()), describe_output(result), reference)
        notes += check_informative(entry.label, flatten(result), list(entry.outputs.leaf_names()),
                                   allow=allow_constant)
        entries.append(entry)
        samples.append(list(inputs.values()))
        outputs.append(flatten(result))
    if sources.given is not None:
        notes += _ungiven_note(entries, sources.given)
    check_reproducible(user.buffers, user.module, user.entry, user.config, files, user.tied,
                       partial(bind_forward, names=declared.names, call=declared.call),
                       samples[0], outputs[0], list(entries[0].outputs.leaf_names()),
                       model_path)
    noises = float64_noise(model, declared.names, declared.call, samples, outputs,
                           progress=progress)
    entries = [dataclasses.replace(entry, noise=noise) for entry, noise in zip(entries, noises)]
    references = [Reference(entry, inputs, flat)
                  for entry, inputs, flat in zip(entries, samples, outputs)]
    return entries, notes, references


#: Fresh inputs for the row proof are drawn with the reference seed moved by this much (and
#: the entry's index), far from any seed a reference of this build used.
FRESH_SEED_OFFSET = 2**62


def _fresh_inputs(index: int, *, declared: DeclaredInputs, decls: list[InputDecl],
                  sources: _Sources, model_path: Path) -> list[torch.Tensor]:
    """Another draw of entry ``index``'s inputs (declared order), from the ``example_input``
    hook or at random: the other clients' rows of the row proof. Never the user's
    ``--reference-inputs``, which hold one batch per shape."""
    seed = (sources.seed + FRESH_SEED_OFFSET + index) % 2**63
    shape_map = declared.per_shape[index]
    return list(reference_inputs(shape_map, decls, seed, sources.hook, model_path).values())


def _prove_rows(entries: list[ShapeEntry], references: list[Reference], forward: Any,
                fresh: Any, padding: Padding | None, progress: bool | None
                ) -> tuple[list[ShapeEntry], list[Reference]]:
    """Each entry with a batch axis gets its ``RowProof`` (``_row_proof``)."""
    proofs = prove_rows(references, fresh, forward, padding, progress=lambda items: progress_bar(
        items, desc="proving rows independent", enabled=progress))
    entries = [dataclasses.replace(entry, rows=proof) for entry, proof in zip(entries, proofs)]
    references = [dataclasses.replace(reference, entry=entry)
                  for reference, entry in zip(references, entries)]
    return entries, references


def _dependent_rows_notes(entries: Sequence[ShapeEntry]) -> list[str]:
    """Said at build: the entries serve will not batch requests into, and why."""
    return [f"shape {entry.label}: rows are not independent, so serve replays each request "
            f"in it alone ({entry.rows.detail})"
            for entry in entries if entry.rows is not None and not entry.rows.independent]


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


def _load_user_model(model_path: Path, includes: Sequence[str | Path], entry: str,
                     config: dict[str, Any], weights: str | Path | None) -> _UserModel:
    sources = _read_sources(model_path, includes)
    source_name = f"{SOURCE_DIR}/{model_path.name}"
    imported_before = set(sys.modules)
    module = import_model_source(source_name, sources, display_path=str(model_path))
    factory = entry_function(module, entry, str(model_path))
    check_entry_named(entry, sources, str(model_path))  # the loader checks this before import
    model = call_factory(factory, config, str(model_path), entry, device="cpu",
                         beside=os.path.dirname(model_path))
    _refuse_unpacked_neighbours(imported_before, model_path, sources)
    check_storable(model, str(model_path))
    tied = tied_groups(model)
    if weights is not None:
        load_strict(model, read_user_weights(weights), tied, str(weights))
    model.eval()  # after weights: QKAN folds masks/biases into eval-time caches here
    return _UserModel(source_name=source_name, sources=sources, module=module, entry=entry,
                      config=config, device_argument=accepts_device(factory), model=model,
                      tied=tied, buffers=buffers_before_forward(model))


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


def _capture_policy(capture: str, submodules: Sequence[str]) -> CapturePolicy:
    if capture not in CAPTURE_POLICIES:
        raise ShapeSpecError(f"capture policy {capture!r} is not one of {', '.join(CAPTURE_POLICIES)}")
    names = tuple(s.strip() for s in submodules if s.strip())
    for name in names:
        if not name.isidentifier():
            raise ShapeSpecError(f"--submodules entry {name!r} is not a class name")
    if names and capture == "full":
        raise ShapeSpecError("--submodules has no effect with --capture full; use submodules/auto")
    return CapturePolicy(policy=capture, submodules=names)


def _read_sources(model_path: Path, includes: Sequence[str | Path]) -> dict[str, bytes]:
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
