"""The manifest: frozen dataclasses describing an artifact, and their JSON.

Every field declares its JSON key and rule (``_schema.json_field``); one reader and one writer
walk those declarations. What reading a field cannot check alone is checked after it
(``_check_manifest``): every input named in every shape, every file listed, padding and
precision figures that fit the declared shapes. The parts with rules of their own live beside
it: the output trees (``_outputs``), padding (``_padding``), reduced precision
(``_precision``) and metadata (``_metadata``). The format version is the document's mark:
the writer writes the lowest version that holds every key it writes (``written_version``),
and the reader refuses a key that came with a later version than its document declares,
before reading any (``_refuse_newer_keys``). A reader here either returns a valid frozen
object or raises a ``QkanPackError`` subclass naming the JSON path (``ManifestError.where``);
no other exception escapes (the property tests hold us to it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..errors import IncompatibleArtifactError, ManifestError
from ._constants import (
    BASE_FORMAT_VERSION,
    CAPTURE_POLICIES,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    MAX_DIM,
    MAX_MANIFEST_BYTES,
    MAX_RANK,
    MAX_SHAPES,
    SHA256_HEX,
    SIGNATURE_NAME,
    WEIGHTS_NAME,
)
from ._grammar import IDENTIFIER, Shape, format_shape
from ._json import loads_strict
from ._metadata import Metadata, metadata_from, metadata_to_dict
from ._outputs import DTYPE, OutputNode, OutputTree
from ._padding import Padding, check_padding
from ._precision import PRECISION, PrecisionChoice, PrecisionPolicy, check_choices
from ._schema import (
    WHEN_DEFAULT,
    Boolean,
    Choice,
    Codec,
    Custom,
    Integer,
    JsonObject,
    ListOf,
    MapOf,
    Nested,
    Nullable,
    Number,
    Text,
    json_field,
    key_path,
    read_object,
    refuse,
    show,
    versioned_keys,
    write_object,
)

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (docs/ARCHITECTURE.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Producer fields the runtime compares with its own versions: text or null.
_PRODUCER_TEXT = ("qkan_pack", "torch", "qkan", "safetensors", "python", "platform", "system",
                  "machine")
CALL_CONVENTIONS = ("positional", "keyword")

#: One accepted input signature: input name -> (shape, dtype), in declared order.
Signature = Mapping[str, tuple[Shape, str]]


def _inside_artifact(path: str) -> bool:
    """A plain relative POSIX path that stays inside the artifact."""
    return bool(path) and len(path) <= 255 and not path.startswith("/") \
        and "\\" not in path and "\x00" not in path \
        and not any(part in ("", ".", "..") for part in path.split("/"))


class _Range(Codec):
    """An input's value range, ``[low, high]``."""

    what = "[low, high] with low < high"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, list) and len(value) == 2 \
            and all(type(v) in (int, float) for v in value) and value[0] < value[1]

    def read(self, value: Any, where: str) -> tuple[float, float]:
        low, high = super().read(value, where)  # as written: an integer stays one
        return low, high

    def write(self, value: Any) -> list[float]:
        return list(value)


TEXT = Text()
TEXTS = MapOf(TEXT)
OBJECT = JsonObject()
PATH = Text(_inside_artifact, "relative and stay inside the artifact")
DIMS = ListOf(Integer(1, MAX_DIM), min_len=1, max_len=MAX_RANK)


# ---------------------------------------------------------------------------
# Manifest model
# ---------------------------------------------------------------------------


def _without_range(decl: InputDecl) -> bool:
    return decl.low is None or decl.high is None


@dataclass(frozen=True)
class InputDecl:
    """One model input: its name, dtype, and for integer inputs (and float inputs built with
    ``--input-range``) the range reference values were drawn from (``low`` inclusive,
    ``high`` exclusive; JSON ``range``) and where that range came from."""

    name: str = json_field(Text(IDENTIFIER, "an identifier"))
    dtype: str = json_field(DTYPE)
    low: float | None = json_field(_Range(), key="range", fills=("low", "high"), default=None,
                                   omit=_without_range)
    high: float | None = None
    range_source: str = json_field(TEXT, default="", omit=_without_range)

    @property
    def index_bounds(self) -> tuple[int, int] | None:
        """``[low, high)`` that every value must lie in, when the range was read off an
        embedding table the input indexes (a value outside fails the model: IndexError on the
        CPU, a device-side assert that ends the CUDA context on a GPU); None when the range
        only says where reference values were drawn from."""
        if not self.range_source.startswith(EMBEDDING_RANGE_PREFIX) or self.low is None \
                or self.high is None:
            return None
        return int(self.low), int(self.high)


#: How ``range_source`` begins for a range read off an embedding table (``embedding_range``).
EMBEDDING_RANGE_PREFIX = "embedding "


def embedding_range(table: str, rows: int) -> str:
    """The ``range_source`` of an input that indexes the embedding ``table`` of ``rows`` rows."""
    return f"{EMBEDDING_RANGE_PREFIX}{table} ({rows} rows)"


#: The longest ``RowProof.detail`` recorded (a measurement in words, never a dump).
MAX_ROW_DETAIL = 400


@dataclass(frozen=True)
class RowProof:
    """Whether each row of an entry's batch gets the answer it would get alone (build ran the
    model with each row's neighbours replaced, and rows alone: ``builder._row_proof``), and
    ``detail``: what showed they depend on each other, or on what the proof could not run.
    serve packs rows of different requests into one replay of the entry only when
    ``independent``."""

    independent: bool = json_field(Boolean())
    detail: str = json_field(TEXT, default="", omit=WHEN_DEFAULT)

    def __post_init__(self) -> None:
        if len(self.detail) > MAX_ROW_DETAIL:
            raise ManifestError(f"is {len(self.detail)} characters; at most {MAX_ROW_DETAIL}",
                                where="detail")


@dataclass(frozen=True)
class ShapeEntry:
    """One declared input signature: a shape per input, its outputs, its reference file."""

    inputs: tuple[tuple[str, Shape], ...] = json_field(MapOf(DIMS, pairs=True))
    outputs: OutputNode = json_field(OutputTree())
    reference: str = json_field(PATH)
    #: The reference outputs' float32 rounding noise (against the model in float64, as a
    #: share of each output's scale); None where build could not measure it (and in
    #: artifacts from before it did).
    noise: float | None = json_field(Nullable(Number()), default=None, omit=WHEN_DEFAULT)
    #: Per reduced precision build gated: how far its outputs were from these references
    #: (and the ``--calibration`` inputs of this shape) on the build host, as a share of each
    #: output's scale, the worst output; None where the build host cannot compute in it (TF32
    #: on a CPU). Shown, never used as a bound: each load measures its own.
    precision_error: Mapping[str, float | None] = json_field(
        MapOf(Nullable(Number(low=0)), key=PRECISION), factory=dict, omit=WHEN_DEFAULT)
    #: Whether its rows are independent (``RowProof``), for an entry with a batch axis of
    #: two rows or more (``entry_batch``); None for others, and where build did not prove
    #: it (artifacts from before it did): serve then never mixes requests' rows in it.
    rows: RowProof | None = json_field(Nullable(Nested(RowProof)), default=None,
                                       omit=WHEN_DEFAULT)

    def __post_init__(self) -> None:
        if self.noise is not None and not 0 <= self.noise <= 1:  # NaN too
            raise ManifestError(f"must be a number in [0, 1], got {show(self.noise)}",
                                where="noise")
        if self.rows is not None and (input_batch(self) or 0) < 2:
            raise ManifestError("is recorded only for a shape whose inputs all lead with one "
                                "batch size of two or more", where="rows")

    @property
    def batches_rows(self) -> bool:
        """Whether rows of different requests may share a replay of this entry: proved
        independent at build."""
        return self.rows is not None and self.rows.independent

    @property
    def label(self) -> str:
        if len(self.inputs) == 1:
            return format_shape(self.inputs[0][1])
        return ",".join(f"{name}:{format_shape(shape)}" for name, shape in self.inputs)


@dataclass(frozen=True)
class CapturePolicy:
    """What a load captures per shape: the whole forward (``full``), submodules (those of
    the classes named in ``submodules``, else the largest blocks that capture), or the whole
    forward falling back to submodules where it cannot be captured (``auto``)."""

    policy: str = json_field(Choice(CAPTURE_POLICIES), default="auto")
    submodules: tuple[str, ...] = json_field(ListOf(Text(IDENTIFIER, "a class name")), default=())


@dataclass(frozen=True)
class FileEntry:
    """One listed file's size and sha256: the digest covers it through the manifest."""

    size: int = json_field(Integer(0))
    sha256: str = json_field(Text(SHA256_HEX, "64 lowercase hex digits"))


@dataclass(frozen=True)
class KernelSet:
    """JIT-compiled kernels shipped for one GPU architecture + toolchain key."""

    key: str = json_field(TEXT)
    directory: str = json_field(PATH)
    details: Mapping[str, str] = json_field(TEXTS, factory=dict)


@dataclass(frozen=True)
class ModelInfo:
    """The model: its source file (and ``--include`` files), the factory (``entry``) and the
    ``config`` it is called with, its parameter count, tied weights, whether the factory
    takes ``device``, and what the build saw of its environment."""

    source: str = json_field(PATH)
    entry: str = json_field(Text(IDENTIFIER, "a Python identifier"))
    config: Mapping[str, Any] = json_field(OBJECT, factory=dict)
    includes: tuple[str, ...] = json_field(ListOf(PATH), default=())
    parameters: int = json_field(Integer(), default=0)
    tied: tuple[tuple[str, ...], ...] = json_field(ListOf(ListOf(TEXT)), default=())
    device_argument: bool = json_field(Boolean(), default=False)
    #: Third-party imports' versions.
    packages: Mapping[str, str] = json_field(TEXTS, factory=dict)
    #: Solvers the modules ran at build (QKAN: exact, flash...).
    solvers: tuple[str, ...] = json_field(ListOf(TEXT), default=())

    _json_order = ("source", "includes", "entry", "config", "device_argument", "parameters",
                   "tied", "packages", "solvers")


_VERSION = Nullable(TEXT)


def _read_producer(value: Any, where: str) -> dict[str, Any]:
    producer = OBJECT.read(value, where)
    for key in _PRODUCER_TEXT:
        _VERSION.read(producer.get(key), key_path(where, key))
    return producer


def _read_metadata(value: Any, where: str) -> Metadata:
    try:
        return metadata_from(value, where)
    except ManifestError as exc:
        if exc.where is None:
            exc.where = where  # its message already names the place: metadata_from was told it
        raise


def _check_input(decl: InputDecl, where: str) -> InputDecl:
    if decl.range_source and _without_range(decl):
        refuse(f"{where}.range_source", "is given without a range")
    return decl


def _check_entry(entry: ShapeEntry, where: str) -> ShapeEntry:
    for name, first, second in entry.outputs.name_clashes()[:1]:
        refuse(f"{where}.outputs", f"give {first} and {second} one name, {name}: output names "
                                   "must differ")
    return entry


@dataclass(frozen=True)
class Manifest:
    """An artifact's description. ``call`` says how inputs reach ``forward``: ``keyword``
    (by their declared names) or ``positional`` (in declared order: one unnamed input, and
    every format-1 artifact)."""

    producer: Mapping[str, Any] = json_field(Custom(_read_producer, dict))
    model: ModelInfo = json_field(Nested(ModelInfo))
    inputs: tuple[InputDecl, ...] = json_field(ListOf(
        Nested(InputDecl, _check_input), min_len=1, unique=(lambda decl: decl.name, "name")))
    shapes: tuple[ShapeEntry, ...] = json_field(ListOf(
        Nested(ShapeEntry, _check_entry), min_len=1, max_len=MAX_SHAPES,
        unique=(lambda entry: frozenset(entry.inputs), "input shapes")))
    capture: CapturePolicy = json_field(Nested(CapturePolicy))
    files: Mapping[str, FileEntry] = json_field(MapOf(Nested(FileEntry), key=PATH, sort=True))
    call: str = json_field(Choice(CALL_CONVENTIONS), default="positional", required=True)
    reference_device: str = json_field(TEXT, default="cpu")
    #: torch float32 matmul precision at build.
    reference_precision: str = json_field(Choice(("highest", "high", "medium")),
                                          default="highest")
    #: The build time format 1 recorded (kept when read); builds are reproducible now,
    #: nothing time-dependent.
    created: str = json_field(TEXT, default="", omit=WHEN_DEFAULT)
    kernels: tuple[KernelSet, ...] = json_field(ListOf(Nested(KernelSet)), default=())
    metadata: Metadata = json_field(Custom(_read_metadata, metadata_to_dict), factory=Metadata)
    #: Declared padding (``build --pad``): calls may be smaller along its axes. None: exact
    #: shapes only.
    padding: Padding | None = json_field(Nullable(Nested(Padding)), default=None,
                                         omit=WHEN_DEFAULT)
    #: Reduced precision (``build --precision``). None: float32, as every artifact built
    #: without it.
    precision: PrecisionPolicy | None = json_field(Nullable(Nested(PrecisionPolicy)),
                                                   default=None, omit=WHEN_DEFAULT)
    format_name: str = json_field(Choice((FORMAT_NAME,)), key="format", default=FORMAT_NAME)
    #: The format version of the document it was read from (None: made in Python). A mark of
    #: the document, not a field the schema reads: the reader checks it before any key
    #: (``parse_manifest``), the writer writes the lowest version that holds the keys it
    #: writes (``written_version``), whatever this says. Equality compares what manifests
    #: say, not the version that spelt it.
    format_version: int | None = field(default=None, compare=False)

    _json_order = ("format_name", "created", "metadata", "producer", "model", "call", "inputs",
                   "shapes", "reference_device", "reference_precision", "capture", "kernels",
                   "padding", "precision", "files")

    def input_dtype(self, name: str) -> str:
        return {decl.name: decl.dtype for decl in self.inputs}[name]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(decl.name for decl in self.inputs)

    def signature(self, entry: ShapeEntry) -> Signature:
        """``entry``'s inputs as ``{name: (shape, dtype)}``, in declared order."""
        dtypes = {decl.name: decl.dtype for decl in self.inputs}
        return {name: (shape, dtypes[name]) for name, shape in entry.inputs}

    def signatures(self) -> tuple[Signature, ...]:
        """Every accepted input signature, in manifest order: the one representation of
        "what this artifact accepts" (errors carry it, serve replies with it)."""
        return tuple(self.signature(entry) for entry in self.shapes)


def manifest_schema(manifest: Manifest) -> dict[str, Any]:
    """What a client may send and will get back, from the recorded entries: each input's
    name, dtype and declared shapes (with its value range where recorded), each output
    leaf's place, dtype and shape per entry, and the entries themselves. Derived, not stored
    a second time: the manifest already records (and digests) every part of it."""
    inputs = []
    for decl in manifest.inputs:
        shapes = [list(dict(entry.inputs)[decl.name]) for entry in manifest.shapes]
        item: dict[str, Any] = {"name": decl.name, "dtype": decl.dtype, "shapes": shapes}
        if decl.low is not None and decl.high is not None:
            item["range"] = [decl.low, decl.high]
        inputs.append(item)
    outputs: dict[str, dict[str, Any]] = {}
    for entry in manifest.shapes:
        for name, spec in zip(entry.outputs.leaf_names(), entry.outputs.leaves()):
            found = outputs.setdefault(name, {"name": name, "dtype": spec.dtype, "shapes": []})
            found["shapes"].append(list(spec.shape))
    return {
        "inputs": inputs,
        "outputs": list(outputs.values()),
        "entries": [{"inputs": {n: list(s) for n, s in entry.inputs},
                     "outputs": OutputTree().write(entry.outputs)} for entry in manifest.shapes],
        "call": manifest.call,
    }


# ---------------------------------------------------------------------------
# JSON I/O
# ---------------------------------------------------------------------------


def manifest_to_dict(manifest: Manifest) -> dict[str, Any]:
    """The manifest as JSON-ready data (what the writer emits): in the current form, at the
    lowest format version that holds every key it uses (``written_version``)."""
    data = write_object(manifest)
    return {"format": data.pop("format"), "format_version": written_version(data), **data}


def written_version(data: Mapping[str, Any]) -> int:
    """The lowest format version that defines every key of manifest JSON ``data``: a
    manifest that uses no key of a newer version keeps the older one, so that older readers
    keep loading it (docs/artifacts.md, "Versions")."""
    return max((BASE_FORMAT_VERSION,
                *(since for _, since in versioned_keys(Manifest, data, "manifest"))))


def precision_choice_to_dict(choice: PrecisionChoice) -> dict[str, Any]:
    """One device's precision choice as JSON-ready data (the manifest's, ``warm --json``'s)."""
    return write_object(choice)


def dumps_manifest(manifest: Manifest) -> bytes:
    return (json.dumps(manifest_to_dict(manifest), indent=2, sort_keys=False) + "\n").encode()


def parse_manifest(data: str | bytes) -> Manifest:
    """Parse and validate manifest JSON; refuse newer formats with 'upgrade qkan-pack'."""
    if len(data) > MAX_MANIFEST_BYTES:
        refuse("manifest", f"is {len(data)} bytes; the limit is {MAX_MANIFEST_BYTES} (a real "
                           "manifest is a few KiB: this one is corrupt or hostile)")
    try:
        raw = loads_strict(data)
    except ManifestError as exc:
        raise ManifestError(f"cannot be read: {exc}", where="manifest") from None
    version = _format_version(raw)
    _refuse_newer_keys(raw, version)
    body = {key: value for key, value in raw.items() if key != "format_version"}
    if version == 1:
        from ._old.v1 import upgrade_v1  # here: only format-1 artifacts pay for its import

        body = upgrade_v1(body)
    return replace(read_object(Manifest, body, "manifest", _check_manifest),
                   format_version=version)


def _format_version(raw: Any) -> int:
    """The format version, after the format name: checked before anything else is read."""
    name = OBJECT.read(raw, "manifest").get("format")
    if name != FORMAT_NAME:
        refuse("manifest.format", f"must be {show(FORMAT_NAME)}, got {show(name)}: not a qkan-pack "
                                  "manifest")
    version = Integer(1).read(raw.get("format_version"), "manifest.format_version")
    if version > FORMAT_VERSION:
        raise IncompatibleArtifactError(
            f"is {version}, newer than this qkan-pack reads (up to {FORMAT_VERSION}): upgrade "
            "qkan-pack (pip install -U qkan-pack)", where="manifest.format_version")
    return version


def _refuse_newer_keys(raw: Any, version: int) -> None:
    """Refuse a key that came with a format version later than the document's: a manifest
    holding it must say so (it was edited, or written by a faulty producer)."""
    for where, since in versioned_keys(Manifest, raw, "manifest"):
        if since > version:
            refuse(where, f"is not a key format {version} defines: it came with format "
                          f"{since}, so a manifest holding it says format_version {since} or "
                          "later (this one was edited, or written by a faulty producer)")


def _check_manifest(manifest: Manifest, where: str) -> Manifest:
    """The rules between a manifest's parts, once each part has been read; the shapes' inputs
    put in declared order."""
    names = list(manifest.input_names)
    shapes = tuple(_in_declared_order(entry, names, f"{where}.shapes[{index}]")
                   for index, entry in enumerate(manifest.shapes))
    manifest = replace(manifest, shapes=shapes)
    _check_files_listed(manifest, where)
    if manifest.padding is not None:
        check_padding(manifest.padding, {decl.name: decl.dtype for decl in manifest.inputs},
                      [(dict(entry.inputs), [leaf.shape for leaf in entry.outputs.leaves()],
                        entry.label) for entry in shapes], f"{where}.padding")
    if manifest.precision is not None:
        check_choices(manifest.precision, len(shapes), f"{where}.precision")
    return manifest


def _in_declared_order(entry: ShapeEntry, names: list[str], where: str) -> ShapeEntry:
    declared = dict(entry.inputs)
    if sorted(declared) != sorted(names):
        refuse(f"{where}.inputs", f"names {show(sorted(declared))}, which differ from "
                                  f"manifest.inputs {show(names)}")
    return replace(entry, inputs=tuple((name, declared[name]) for name in names))


def _check_files_listed(manifest: Manifest, where: str) -> None:
    """Every file the manifest names is in ``files``; the reserved names are not."""
    files = manifest.files
    named = [(f"{where}.shapes[{index}].reference", entry.reference)
             for index, entry in enumerate(manifest.shapes)]
    named += [(f"{where}.model.source", manifest.model.source)]
    named += [(f"{where}.model.includes[{index}]", path)
              for index, path in enumerate(manifest.model.includes)]
    for here, path in named:
        if path not in files:
            refuse(here, f"{show(path)} is not listed in {where}.files")
    if WEIGHTS_NAME not in files:
        refuse(f"{where}.files", f"does not list {WEIGHTS_NAME}")
    for name in (SIGNATURE_NAME, MANIFEST_NAME):
        if name in files:
            refuse(key_path(f"{where}.files", name), "is reserved: the signature and the "
                                                     "manifest itself are never listed")


def input_batch(entry: ShapeEntry) -> int | None:
    """The size every input of the entry leads with, if they share one; else None."""
    batches = {shape[0] for _, shape in entry.inputs}
    return next(iter(batches)) if len(batches) == 1 else None


def entry_batch(entry: ShapeEntry) -> int | None:
    """The entry's batch size, when it has a batch axis: every input leads with one size
    and every output leads with it too (so rows can be sliced back); else None."""
    batch = input_batch(entry)
    if batch is None or not all(leaf.shape and leaf.shape[0] == batch
                                for leaf in entry.outputs.leaves()):
        return None
    return batch


def padding_table(manifest: Manifest) -> dict[tuple[Shape, ...], list[tuple[int, int]]]:
    """Row shape (non-batch dims per input) -> [(batch, shape index)] ascending, for every
    entry with a batch axis (``entry_batch``)."""
    table: dict[tuple[Shape, ...], list[tuple[int, int]]] = {}
    for index, entry in enumerate(manifest.shapes):
        batch = entry_batch(entry)
        if batch is None:
            continue
        tail = tuple(tuple(shape[1:]) for _, shape in entry.inputs)
        table.setdefault(tail, []).append((batch, index))
    for rows in table.values():
        rows.sort()
    return table
