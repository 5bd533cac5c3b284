"""The manifest: frozen dataclasses describing an artifact, and their strict JSON I/O.

Every reader here either returns a valid frozen object or raises a ``QkanPackError``
subclass; no other exception escapes (the property tests hold us to it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import IncompatibleArtifactError, ManifestError, ShapeSpecError
from ._constants import (
    CAPTURE_POLICIES,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    MAX_DIM,
    MAX_MANIFEST_BYTES,
    MAX_MAX_ERROR,
    MAX_RANK,
    MAX_SHAPES,
    PRECISIONS,
    SHA256_HEX,
    SIGNATURE_NAME,
    WEIGHTS_NAME,
)
from ._grammar import IDENTIFIER, Shape, check_dtype, format_shape
from ._json import loads_strict
from ._metadata import Metadata, metadata_from, metadata_to_dict
from ._old.v1 import upgrade_v1
from ._padding import Padding, padding_from, padding_to_dict

#: Producer fields the runtime compares with its own versions: text or null.
_PRODUCER_TEXT = ("qkan_pack", "torch", "qkan", "safetensors", "python", "platform", "system",
                  "machine")
CALL_CONVENTIONS = ("positional", "keyword")
OUTPUT_KINDS = ("tensor", "tuple", "list", "dict", "none")
#: How a recorded output class is rebuilt from its items: ``mapping`` (a dict subclass such as
#: transformers' ModelOutput, ``cls(**items)``), ``dataclass`` (``cls(**fields)``),
#: ``namedtuple`` (``cls(*items)``).
OUTPUT_CLASS_FORMS = ("mapping", "dataclass", "namedtuple")

#: One accepted input signature: input name -> (shape, dtype), in declared order.
Signature = Mapping[str, tuple[Shape, str]]


# ---------------------------------------------------------------------------
# Manifest model
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    shape: Shape
    dtype: str

    @property
    def label(self) -> str:
        return f"{format_shape(self.shape)} {self.dtype}"


@dataclass(frozen=True)
class OutputClass:
    """The Python class an output container had at build (e.g. a transformers ModelOutput).

    Resolved at load only from modules the verified model source already imported; never
    imported by name from the manifest.
    """

    module: str
    qualname: str
    form: str  # one of OUTPUT_CLASS_FORMS

    @property
    def label(self) -> str:
        return self.qualname


@dataclass(frozen=True)
class OutputNode:
    """One node of a model's output structure: a tensor, None, a tuple/list or a dict,
    the containers optionally of a recorded class (``cls``)."""

    kind: str  # one of OUTPUT_KINDS
    tensor: TensorSpec | None = None
    items: tuple[OutputNode, ...] = ()
    keys: tuple[str, ...] = ()
    cls: OutputClass | None = None

    def leaves(self) -> Iterator[TensorSpec]:
        if self.kind == "tensor" and self.tensor is not None:
            yield self.tensor
        for item in self.items:
            yield from item.leaves()

    def leaf_names(self, prefix: str = "output") -> Iterator[str]:
        """Each tensor leaf's name, in ``leaves()`` order: ``output``, ``output[0].boxes``
        (keys joined with ``.``, indices as ``[i]``): the one flattening rule, by which
        ``predict``'s files, ``GET /`` and the Open Inference Protocol name outputs."""
        return (name for name, _ in self._leaf_places(prefix, prefix))

    def _leaf_places(self, name: str, place: str) -> Iterator[tuple[str, str]]:
        """(name, place) per tensor leaf; the place spells every key (``output['a.b']``)."""
        if self.kind == "tensor" and self.tensor is not None:
            yield name, place
        for index, item in enumerate(self.items):
            if self.kind == "dict":
                key = self.keys[index]
                yield from item._leaf_places(f"{name}.{key}", f"{place}[{key!r}]")
            else:
                yield from item._leaf_places(f"{name}[{index}]", f"{place}[{index}]")

    def name_clashes(self) -> list[tuple[str, str, str]]:
        """Tensor leaves that ``leaf_names`` gives one name (a key holding the separator:
        ``{"a.b": y, "a": {"b": z}}``), as ``(name, first place, second place)``."""
        seen: dict[str, str] = {}
        clashes = []
        for name, place in self._leaf_places("output", "output"):
            if name in seen:
                clashes.append((name, seen[name], place))
            else:
                seen[name] = place
        return clashes

    @property
    def label(self) -> str:
        if self.kind == "tensor" and self.tensor is not None:
            return self.tensor.label
        if self.kind == "none":
            return "None"
        inner = ", ".join(
            f"{k}: {v.label}" if self.kind == "dict" else v.label
            for k, v in zip(self.keys or [""] * len(self.items), self.items)
        )
        text = {"tuple": f"({inner})", "list": f"[{inner}]", "dict": f"{{{inner}}}"}[self.kind]
        return f"{self.cls.label}{text}" if self.cls is not None else text


@dataclass(frozen=True)
class InputDecl:
    """One model input: its name, dtype, and for integer inputs (and float inputs built with
    ``--input-range``) the range reference values were drawn from (``low`` inclusive,
    ``high`` exclusive) and where that range came from."""

    name: str
    dtype: str
    low: float | None = None
    high: float | None = None
    range_source: str = ""

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

    independent: bool
    detail: str = ""

    def __post_init__(self) -> None:
        if len(self.detail) > MAX_ROW_DETAIL:
            raise ManifestError(f"rows.detail is {len(self.detail)} characters; at most "
                                f"{MAX_ROW_DETAIL}")


@dataclass(frozen=True)
class ShapeEntry:
    """One declared input signature: a shape per input, its outputs, its reference file."""

    inputs: tuple[tuple[str, Shape], ...]
    outputs: OutputNode
    reference: str
    #: The reference outputs' float32 rounding noise (against the model in float64, as a
    #: share of each output's scale); None where build could not measure it (and in
    #: artifacts from before it did).
    noise: float | None = None
    #: Per reduced precision build gated: how far its outputs were from these references
    #: (and the ``--calibration`` inputs of this shape) on the build host, as a share of each
    #: output's scale, the worst output; None where the build host cannot compute in it (TF32
    #: on a CPU). Shown, never used as a bound: each load measures its own.
    precision_error: Mapping[str, float | None] = field(default_factory=dict)
    #: Whether its rows are independent (``RowProof``), for an entry with a batch axis of
    #: two rows or more (``entry_batch``); None for others, and where build did not prove
    #: it (artifacts from before it did): serve then never mixes requests' rows in it.
    rows: RowProof | None = None

    def __post_init__(self) -> None:
        if self.noise is not None and not 0 <= self.noise <= 1:  # NaN too
            raise ManifestError(f"shape {self.label}: noise must be a number in [0, 1], "
                                f"got {self.noise!r}")
        if self.rows is not None and (input_batch(self) or 0) < 2:
            raise ManifestError(f"shape {self.label}: rows is recorded only for a shape whose "
                                "inputs all lead with one batch size of two or more")

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
    policy: str = "auto"
    submodules: tuple[str, ...] = ()


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class KernelSet:
    """JIT-compiled kernels shipped for one GPU architecture + toolchain key."""

    key: str
    directory: str
    details: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PrecisionChoice:
    """What ``qkan-pack warm --precision auto`` measured on one kind of device (``key``:
    ``runtime.precision_key``) and the precision it chose there: per precision timed, each
    shape's median call latency (microseconds) and measured error (share of the outputs'
    scale against the float32 references), in manifest order; ``refused``: the precisions
    that did not run there, and why. ``shapes``: the precision each shape runs, in manifest
    order (each shape is its own graph, so a launch-bound batch of one may stay float32
    where a large batch gains from bfloat16); empty: every shape runs ``precision``, the
    choice over all shapes."""

    key: str
    precision: str
    details: Mapping[str, str] = field(default_factory=dict)
    latency_us: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    error: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    shapes: tuple[str, ...] = ()

    def for_shape(self, index: int) -> str:
        """The precision manifest shape ``index`` runs on this kind of device."""
        return self.shapes[index] if self.shapes else self.precision

    def mean_latency_us(self, precision: str) -> float:
        """``precision``'s latency over the shapes: their geometric mean (``geometric_mean``)."""
        return geometric_mean(self.latency_us[precision])


def geometric_mean(values: Sequence[float]) -> float:
    """The geometric mean of per-shape latencies: every shape weighs alike whatever its size
    (what ``warm --precision auto`` compares precisions by)."""
    if not values:
        return math.inf
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


@dataclass(frozen=True)
class PrecisionPolicy:
    """The reduced precision an artifact may compute in (``build --precision``).

    ``default`` runs where no choice names the loading device (float32 for ``--precision
    auto``); ``allowed`` are the precisions build gated (float32 always among them), which a
    load may be asked for and ``warm --precision auto`` chooses among; ``max_error`` bounds
    every one of them at every load, on the loading device (a share of each output's scale).
    """

    default: str
    max_error: float
    allowed: tuple[str, ...]
    choices: tuple[PrecisionChoice, ...] = ()

    def __post_init__(self) -> None:
        if self.default not in self.allowed or "fp32" not in self.allowed:
            raise ManifestError(f"precision: default {self.default!r} and fp32 must be among "
                                f"the allowed precisions {list(self.allowed)}")
        if not 0 < self.max_error <= MAX_MAX_ERROR:  # NaN too
            raise ManifestError(f"precision.max_error must be in (0, {MAX_MAX_ERROR:g}], "
                                f"got {self.max_error!r:.40}")

    def choice(self, key: str) -> PrecisionChoice | None:
        """The choice recorded for device ``key``, if any."""
        return next((c for c in self.choices if c.key == key), None)


@dataclass(frozen=True)
class ModelInfo:
    source: str
    entry: str
    config: Mapping[str, Any]
    includes: tuple[str, ...] = ()
    parameters: int = 0
    tied: tuple[tuple[str, ...], ...] = ()
    device_argument: bool = False
    packages: Mapping[str, str] = field(default_factory=dict)  # third-party imports' versions
    solvers: tuple[str, ...] = ()  # solvers the modules ran at build (QKAN: exact, flash...)


@dataclass(frozen=True)
class Manifest:
    """An artifact's description. ``call`` says how inputs reach ``forward``: ``keyword``
    (by their declared names) or ``positional`` (in declared order: one unnamed input, and
    every format-1 artifact)."""

    producer: Mapping[str, Any]
    model: ModelInfo
    inputs: tuple[InputDecl, ...]
    shapes: tuple[ShapeEntry, ...]
    capture: CapturePolicy
    files: Mapping[str, FileEntry]
    call: str = "positional"
    reference_device: str = "cpu"
    reference_precision: str = "highest"  # torch float32 matmul precision at build
    created: str = ""  # format 1 only: builds are reproducible, nothing time-dependent
    kernels: tuple[KernelSet, ...] = ()
    metadata: Metadata = field(default_factory=Metadata)
    #: Declared padding (``build --pad``): calls may be smaller along its axes. None: exact
    #: shapes only.
    padding: Padding | None = None
    #: Reduced precision (``build --precision``). None: float32, as every artifact built
    #: without it.
    precision: PrecisionPolicy | None = None
    format_name: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION

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
                     "outputs": _output_to_dict(entry.outputs)} for entry in manifest.shapes],
        "call": manifest.call,
    }


# ---------------------------------------------------------------------------
# JSON I/O
# ---------------------------------------------------------------------------


def manifest_to_dict(manifest: Manifest) -> dict[str, Any]:
    """The manifest as JSON-ready data, in the current format (what the writer emits)."""
    return {
        "format": manifest.format_name,
        "format_version": manifest.format_version,
        "metadata": metadata_to_dict(manifest.metadata),
        "producer": dict(manifest.producer),
        "model": _model_to_dict(manifest.model),
        "call": manifest.call,
        "inputs": [_input_to_dict(d) for d in manifest.inputs],
        "shapes": [_shape_to_dict(entry) for entry in manifest.shapes],
        "reference_device": manifest.reference_device,
        "reference_precision": manifest.reference_precision,
        "capture": {
            "policy": manifest.capture.policy,
            "submodules": list(manifest.capture.submodules),
        },
        "kernels": [
            {"key": k.key, "directory": k.directory, "details": dict(k.details)}
            for k in manifest.kernels
        ],
        **({"padding": padding_to_dict(manifest.padding)} if manifest.padding else {}),
        **({"precision": _precision_to_dict(manifest.precision)} if manifest.precision else {}),
        "files": {
            name: {"size": entry.size, "sha256": entry.sha256}
            for name, entry in sorted(manifest.files.items())
        },
    }


def _model_to_dict(model: ModelInfo) -> dict[str, Any]:
    return {
        "source": model.source,
        "includes": list(model.includes),
        "entry": model.entry,
        "config": dict(model.config),
        "device_argument": model.device_argument,
        "parameters": model.parameters,
        "tied": [list(group) for group in model.tied],
        "packages": dict(model.packages),
        "solvers": list(model.solvers),
    }


def _shape_to_dict(entry: ShapeEntry) -> dict[str, Any]:
    return {
        "inputs": {name: list(shape) for name, shape in entry.inputs},
        "outputs": _output_to_dict(entry.outputs),
        "reference": entry.reference,
        **({} if entry.noise is None else {"noise": entry.noise}),
        **({"precision_error": dict(entry.precision_error)} if entry.precision_error else {}),
        **({} if entry.rows is None else {"rows": _rows_to_dict(entry.rows)}),
    }


def _rows_to_dict(rows: RowProof) -> dict[str, Any]:
    return {"independent": rows.independent, **({"detail": rows.detail} if rows.detail else {})}


def _precision_to_dict(policy: PrecisionPolicy) -> dict[str, Any]:
    return {
        "default": policy.default,
        "max_error": policy.max_error,
        "allowed": list(policy.allowed),
        "choices": [precision_choice_to_dict(choice) for choice in policy.choices],
    }


def precision_choice_to_dict(choice: PrecisionChoice) -> dict[str, Any]:
    """One device's precision choice as JSON-ready data (the manifest's, ``warm --json``'s)."""
    return {"key": choice.key, "precision": choice.precision, "details": dict(choice.details),
            "latency_us": {p: list(v) for p, v in choice.latency_us.items()},
            "error": {p: list(v) for p, v in choice.error.items()},
            "refused": dict(choice.refused),
            **({"shapes": list(choice.shapes)} if choice.shapes else {})}


def dumps_manifest(manifest: Manifest) -> bytes:
    return (json.dumps(manifest_to_dict(manifest), indent=2, sort_keys=False) + "\n").encode()


def _input_to_dict(decl: InputDecl) -> dict[str, Any]:
    data: dict[str, Any] = {"name": decl.name, "dtype": decl.dtype}
    if decl.low is not None and decl.high is not None:
        data["range"] = [decl.low, decl.high]
        data["range_source"] = decl.range_source
    return data


def _output_to_dict(node: OutputNode) -> dict[str, Any]:
    if node.kind == "tensor" and node.tensor is not None:
        return {"tensor": {"shape": list(node.tensor.shape), "dtype": node.tensor.dtype}}
    if node.kind == "none":
        return {"none": None}
    if node.kind == "dict":
        data: dict[str, Any] = {"dict": {k: _output_to_dict(v) for k, v in zip(node.keys, node.items)}}
    else:
        data = {node.kind: [_output_to_dict(item) for item in node.items]}
    if node.cls is not None:
        data["class"] = {"module": node.cls.module, "qualname": node.cls.qualname,
                         "form": node.cls.form}
    return data


def parse_manifest(data: str | bytes) -> Manifest:
    """Parse and validate manifest JSON; refuse newer formats with 'upgrade qkan-pack'."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(
            f"manifest is {len(data)} bytes; the limit is {MAX_MANIFEST_BYTES} "
            "(a real manifest is a few KiB: this one is corrupt or hostile)"
        )
    raw = loads_strict(data)
    reader = _Reader(raw, "manifest")
    version = _check_format(reader)
    if version == 1:
        reader = _Reader(upgrade_v1(reader.raw), "manifest")
    return reader.build(_manifest_from)


def _check_format(reader: _Reader) -> int:
    name = reader.get("format", str)
    if name != FORMAT_NAME:
        raise ManifestError(f"not a qkan-pack manifest (format {name!r}, expected {FORMAT_NAME!r})")
    version = reader.get("format_version", int)
    if version > FORMAT_VERSION:
        raise IncompatibleArtifactError(
            f"artifact format version {version} is newer than this qkan-pack reads "
            f"(up to {FORMAT_VERSION}): upgrade qkan-pack (pip install -U qkan-pack)"
        )
    if version < 1:
        raise ManifestError(f"format_version {version} is invalid: versions start at 1")
    return version


def _manifest_from(reader: _Reader) -> Manifest:
    inputs = _inputs_from(reader)
    shapes = _shapes_from(reader, [d.name for d in inputs])
    files = reader.child("files").mapping(_file_from)
    model = reader.child("model").build(_model_from)
    _check_files_listed(files, shapes, model)
    return Manifest(
        format_version=reader.get("format_version", int),
        created=reader.get("created", str, default=""),
        producer=reader.child("producer").build(_producer_from),
        model=model,
        call=reader.choice("call", CALL_CONVENTIONS),
        inputs=inputs,
        shapes=shapes,
        reference_device=reader.get("reference_device", str, default="cpu"),
        reference_precision=reader.choice("reference_precision", ("highest", "high", "medium"),
                                          default="highest"),
        capture=reader.child("capture").build(_capture_from),
        kernels=tuple(reader.each("kernels", _kernel_from, default=[])),
        metadata=metadata_from(reader.raw.get("metadata")),
        padding=_padding_from(reader.raw.get("padding"), inputs, shapes),
        precision=_precision_from(reader.raw.get("precision"), len(shapes)),
        files=files,
    )


def _precision_from(raw: Any, shapes: int) -> PrecisionPolicy | None:
    """``manifest.precision``: known precisions only, float32 always allowed, ``max_error``
    within ``MAX_MAX_ERROR``, one choice per device key naming an allowed precision, and
    figures for every shape of each precision timed."""
    if raw is None:
        return None
    reader = _Reader(raw, "manifest.precision")
    allowed = tuple(_precision_names(reader.get("allowed", list), "manifest.precision.allowed"))
    if len(set(allowed)) != len(allowed) or "fp32" not in allowed:
        raise ManifestError(f"manifest.precision.allowed must list fp32 and each precision once, "
                            f"got {list(allowed)}")
    default = reader.choice("default", tuple(PRECISIONS))
    max_error = reader.get("max_error", float)
    choices = tuple(reader.each("choices", lambda r: _choice_from(r, allowed, shapes),
                                default=[]))
    if len({c.key for c in choices}) != len(choices):
        raise ManifestError("manifest.precision.choices names a device key twice")
    return PrecisionPolicy(default=default, max_error=float(max_error), allowed=allowed,
                           choices=choices)


def _precision_names(value: list[Any], where: str) -> list[str]:
    if not all(isinstance(v, str) and v in PRECISIONS for v in value):
        raise ManifestError(f"{where} must list precisions among {list(PRECISIONS)}")
    return value


def _choice_from(reader: _Reader, allowed: tuple[str, ...], shapes: int) -> PrecisionChoice:
    precision = reader.choice("precision", allowed)
    figures = {}
    for name in ("latency_us", "error"):
        table = reader.get(name, dict, default={})
        _precision_names(list(table), f"{reader.where}.{name}")
        for key, values in table.items():
            if key not in allowed or not isinstance(values, list) or len(values) != shapes \
                    or not all(_non_negative(v) for v in values):
                raise ManifestError(f"{reader.where}.{name}.{key} must be {shapes} non-negative "
                                    "numbers (one per shape) of an allowed precision")
        figures[name] = {key: tuple(float(v) for v in values) for key, values in table.items()}
    refused = _text_mapping(reader.get("refused", dict, default={}), f"{reader.where}.refused")
    _precision_names(list(refused), f"{reader.where}.refused")
    per_shape = reader.get("shapes", list, default=[])
    if per_shape and (len(per_shape) != shapes or not all(p in allowed for p in per_shape)):
        raise ManifestError(f"{reader.where}.shapes must name one allowed precision per shape "
                            f"({shapes}), among {list(allowed)}")
    return PrecisionChoice(
        key=reader.get("key", str), precision=precision,
        details=_text_mapping(reader.get("details", dict, default={}), f"{reader.where}.details"),
        latency_us=figures["latency_us"], error=figures["error"], refused=refused,
        shapes=tuple(per_shape))


def _non_negative(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= 0


def _padding_from(raw: Any, inputs: Sequence[InputDecl],
                  shapes: Sequence[ShapeEntry]) -> Padding | None:
    """``manifest.padding`` checked against the declared inputs and entries: every axis's
    members share their size in each entry, and every output dimension said to follow an
    axis is that axis's size in each entry (else a padded call's outputs would be cut
    along a dimension that does not follow it)."""
    dtypes = {d.name: d.dtype for d in inputs}
    first = dict(shapes[0].inputs)
    leaf_ranks = [len(leaf.shape) for leaf in shapes[0].outputs.leaves()]
    padding = padding_from(raw, dtypes, {n: len(s) for n, s in first.items()}, leaf_ranks)
    if padding is None:
        return None
    for entry in shapes:
        sizes = dict(entry.inputs)
        leaves = [leaf.shape for leaf in entry.outputs.leaves()]
        for axis in padding.axes:
            if len({sizes[name][dim] for name, dim in axis.inputs}) != 1:
                raise ManifestError(f"manifest.padding: axis {axis.label} has members of "
                                    f"different sizes in shape {entry.label}")
            name, dim = axis.inputs[0]
            for leaf, out_dim in axis.outputs:
                if leaf >= len(leaves) or out_dim >= len(leaves[leaf]) \
                        or leaves[leaf][out_dim] != sizes[name][dim]:
                    raise ManifestError(f"manifest.padding: output {leaf} dim {out_dim} is said "
                                        f"to follow axis {axis.label}, but is not its size in "
                                        f"shape {entry.label}")
    return padding


def _inputs_from(reader: _Reader) -> tuple[InputDecl, ...]:
    inputs = tuple(reader.each("inputs", _input_from))
    names = [d.name for d in inputs]
    if not names:
        raise ManifestError("manifest.inputs is empty: an artifact declares at least one input")
    if len(set(names)) != len(names):
        raise ManifestError(f"manifest.inputs repeats a name: {names}")
    return inputs


def _shapes_from(reader: _Reader, names: list[str]) -> tuple[ShapeEntry, ...]:
    shapes = tuple(reader.each("shapes", lambda r: _shape_from(r, names)))
    if not shapes:
        raise ManifestError("manifest.shapes is empty: an artifact declares at least one shape")
    if len(shapes) > MAX_SHAPES:
        raise ManifestError(f"manifest declares {len(shapes)} shapes; at most {MAX_SHAPES}")
    if len({s.inputs for s in shapes}) != len(shapes):
        raise ManifestError("manifest.shapes declares the same input shapes twice")
    return shapes


def _check_files_listed(files: Mapping[str, FileEntry], shapes: Sequence[ShapeEntry],
                        model: ModelInfo) -> None:
    """Every file the manifest names is in ``files``; the reserved names are not."""
    for entry in shapes:
        if entry.reference not in files:
            raise ManifestError(f"reference {entry.reference!r} is not listed in manifest.files")
    for path in (model.source, *model.includes):
        if path not in files:
            raise ManifestError(f"model source {path!r} is not listed in manifest.files")
    if WEIGHTS_NAME not in files:
        raise ManifestError(f"{WEIGHTS_NAME} is not listed in manifest.files")
    if SIGNATURE_NAME in files or MANIFEST_NAME in files:
        raise ManifestError(f"manifest.files lists {SIGNATURE_NAME} or {MANIFEST_NAME}: those "
                            "names are reserved (the signature and the manifest itself)")


def _producer_from(reader: _Reader) -> dict[str, Any]:
    for key in _PRODUCER_TEXT:
        if reader.raw.get(key) is not None:
            reader.get(key, str)
    return reader.raw


def _input_from(reader: _Reader) -> InputDecl:
    name = reader.get("name", str)
    if not IDENTIFIER.match(name):
        raise ManifestError(f"{reader.where}.name {name!r} is not an identifier")
    try:
        dtype = check_dtype(reader.get("dtype", str))
    except ShapeSpecError as exc:
        raise ManifestError(f"{reader.where}.dtype: {exc}") from None
    bounds = reader.get("range", list, default=None)
    if bounds is None:
        return InputDecl(name=name, dtype=dtype)
    if len(bounds) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                   for v in bounds) or not bounds[0] < bounds[1]:
        raise ManifestError(f"{reader.where}.range must be [low, high] with low < high")
    return InputDecl(name=name, dtype=dtype, low=bounds[0], high=bounds[1],
                     range_source=reader.get("range_source", str, default=""))


def _shape_from(reader: _Reader, names: list[str]) -> ShapeEntry:
    declared = reader.get("inputs", dict)
    if sorted(declared) != sorted(names):
        raise ManifestError(
            f"{reader.where}.inputs names {sorted(declared)} differ from manifest.inputs {names}"
        )
    inputs = tuple((name, _shape_value(declared[name], f"{reader.where}.inputs.{name}"))
                   for name in names)
    outputs = _output_from(reader.get("outputs", dict), f"{reader.where}.outputs", 0)
    for name, first, second in outputs.name_clashes()[:1]:
        raise ManifestError(f"{reader.where}.outputs: {first} and {second} are both named "
                            f"{name}; output names must differ")
    return ShapeEntry(
        inputs=inputs,
        outputs=outputs,
        reference=_relative_path(reader.get("reference", str), f"{reader.where}.reference"),
        noise=_noise_from(reader),
        precision_error=_precision_error_from(reader),
        rows=_rows_from(reader.raw.get("rows"), f"{reader.where}.rows"),
    )


def _rows_from(raw: Any, where: str) -> RowProof | None:
    """``shapes[i].rows``: ``{"independent": bool, "detail": text}``, nothing else."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not set(raw) <= {"independent", "detail"}:
        raise ManifestError(f"{where} must be {{\"independent\": true|false, \"detail\": text}}")
    reader = _Reader(raw, where)
    return RowProof(independent=reader.get("independent", bool),
                    detail=reader.get("detail", str, default=""))


def _precision_error_from(reader: _Reader) -> dict[str, float | None]:
    table = reader.get("precision_error", dict, default={})
    _precision_names(list(table), f"{reader.where}.precision_error")
    for key, value in table.items():
        if value is not None and not _non_negative(value):
            raise ManifestError(f"{reader.where}.precision_error.{key} must be a non-negative "
                                f"number or null, got {value!r:.60}")
    return {key: None if value is None else float(value) for key, value in table.items()}


def _noise_from(reader: _Reader) -> float | None:
    value = reader.raw.get("noise")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ManifestError(f"{reader.where}.noise must be a number in [0, 1], got {value!r:.60}")
    return float(value)


def _shape_value(value: Any, where: str) -> Shape:
    if not isinstance(value, list) or not value or len(value) > MAX_RANK:
        raise ManifestError(f"{where} must be a list of 1..{MAX_RANK} positive integers")
    for dim in value:
        if type(dim) is not int or dim <= 0 or dim > MAX_DIM:
            raise ManifestError(f"{where} has invalid dimension {dim!r}")
    return tuple(value)


def _output_from(value: dict[str, Any], where: str, depth: int) -> OutputNode:
    if depth > 16:
        raise ManifestError(f"{where} nests deeper than 16 levels")
    value = dict(value)
    cls = _output_class(value.pop("class"), f"{where}.class") if "class" in value else None
    if len(value) != 1:
        raise ManifestError(f"{where} must have exactly one of {'/'.join(OUTPUT_KINDS)}")
    ((kind, body),) = value.items()
    node = _output_body(kind, body, where, depth)
    if cls is not None:
        if node.kind not in ("tuple", "dict") or (cls.form == "namedtuple") != (node.kind == "tuple"):
            raise ManifestError(f"{where}.class {cls.form} does not fit a {node.kind} output")
        return OutputNode(node.kind, items=node.items, keys=node.keys, cls=cls)
    return node


def _output_class(value: Any, where: str) -> OutputClass:
    reader = _Reader(value, where)
    module, qualname = reader.get("module", str), reader.get("qualname", str)
    if not all(IDENTIFIER.match(part) for part in (*module.split("."), *qualname.split("."))):
        raise ManifestError(f"{where}: {module!r}.{qualname!r} is not a dotted Python name")
    return OutputClass(module=module, qualname=qualname,
                       form=reader.choice("form", OUTPUT_CLASS_FORMS))


def _output_body(kind: str, body: Any, where: str, depth: int) -> OutputNode:
    if kind == "none" and body is None:
        return OutputNode("none")
    if kind == "tensor":
        sub = _Reader(body, where + ".tensor")
        try:
            dtype = check_dtype(sub.get("dtype", str))
        except ShapeSpecError as exc:
            raise ManifestError(f"{where}.tensor.dtype: {exc}") from None
        shape = sub.get("shape", list)
        if len(shape) > MAX_RANK or any(type(d) is not int or d < 0 for d in shape):
            raise ManifestError(f"{where}.tensor.shape {shape!r} is invalid")
        return OutputNode("tensor", tensor=TensorSpec(tuple(shape), dtype))
    if kind in ("tuple", "list") and isinstance(body, list):
        items = tuple(_child_output(v, f"{where}.{kind}[{i}]", depth) for i, v in enumerate(body))
        return OutputNode(kind, items=items)
    if kind == "dict" and isinstance(body, dict):
        items = tuple(_child_output(v, f"{where}.dict.{k}", depth) for k, v in body.items())
        return OutputNode("dict", items=items, keys=tuple(body))
    raise ManifestError(f"{where}: unknown output kind {kind!r} or malformed body")


def _child_output(value: Any, where: str, depth: int) -> OutputNode:
    if not isinstance(value, dict):
        raise ManifestError(f"{where} must be an object")
    return _output_from(value, where, depth + 1)


def _model_from(reader: _Reader) -> ModelInfo:
    entry = reader.get("entry", str)
    if not IDENTIFIER.match(entry):
        raise ManifestError(f"manifest.model.entry {entry!r} is not a Python identifier")
    tied = reader.get("tied", list, default=[])
    if not all(isinstance(g, list) and all(isinstance(n, str) for n in g) for g in tied):
        raise ManifestError("manifest.model.tied must be a list of lists of tensor names")
    includes = reader.get("includes", list, default=[])
    if not all(isinstance(p, str) for p in includes):
        raise ManifestError("manifest.model.includes must be a list of paths")
    return ModelInfo(
        source=_relative_path(reader.get("source", str), "manifest.model.source"),
        includes=tuple(_relative_path(p, "manifest.model.includes") for p in includes),
        entry=entry,
        config=reader.get("config", dict, default={}),
        device_argument=reader.get("device_argument", bool, default=False),
        parameters=reader.get("parameters", int, default=0),
        tied=tuple(tuple(g) for g in tied),
        packages=_text_mapping(reader.get("packages", dict, default={}), "manifest.model.packages"),
        solvers=tuple(_text_list(reader.get("solvers", list, default=[]), "manifest.model.solvers")),
    )


def _text_list(value: list[Any], where: str) -> list[str]:
    if not all(isinstance(v, str) for v in value):
        raise ManifestError(f"{where} must list names")
    return value


def _text_mapping(value: dict[str, Any], where: str) -> dict[str, str]:
    if not all(isinstance(v, str) for v in value.values()):
        raise ManifestError(f"{where} must map names to text")
    return dict(value)


def _capture_from(reader: _Reader) -> CapturePolicy:
    policy = reader.get("policy", str, default="auto")
    if policy not in CAPTURE_POLICIES:
        raise ManifestError(f"manifest.capture.policy {policy!r} is not one of {CAPTURE_POLICIES}")
    names = reader.get("submodules", list, default=[])
    if not all(isinstance(n, str) and IDENTIFIER.match(n) for n in names):
        raise ManifestError("manifest.capture.submodules must list class names")
    return CapturePolicy(policy=policy, submodules=tuple(names))


def _kernel_from(reader: _Reader) -> KernelSet:
    return KernelSet(
        key=reader.get("key", str),
        directory=_relative_path(reader.get("directory", str), f"{reader.where}.directory"),
        details=_text_mapping(reader.get("details", dict, default={}), f"{reader.where}.details"),
    )


def _file_from(reader: _Reader) -> FileEntry:
    size = reader.get("size", int)
    digest = reader.get("sha256", str)
    if size < 0:
        raise ManifestError(f"{reader.where}.size is negative")
    if not SHA256_HEX.match(digest):
        raise ManifestError(f"{reader.where}.sha256 is not 64 lowercase hex digits")
    return FileEntry(size=size, sha256=digest)


def _relative_path(path: str, where: str) -> str:
    """Accept only plain relative POSIX paths that stay inside the artifact."""
    parts = path.split("/")
    bad = (
        not path
        or path.startswith("/")
        or "\\" in path
        or "\x00" in path
        or any(p in ("", ".", "..") for p in parts)
        or len(path) > 255
    )
    if bad:
        raise ManifestError(f"{where}: path {path!r} must be relative and stay inside the artifact")
    return path


class _Reader:
    """Typed access to one JSON object with error messages that name the field."""

    def __init__(self, raw: Any, where: str) -> None:
        if not isinstance(raw, dict):
            raise ManifestError(f"{where} must be a JSON object, got {type(raw).__name__}")
        self.raw = raw
        self.where = where

    _MISSING = object()

    def get(self, key: str, kind: type, default: Any = _MISSING) -> Any:
        if key not in self.raw:
            if default is self._MISSING:
                raise ManifestError(f"{self.where}.{key} is missing")
            return default
        value = self.raw[key]
        if kind is int and (type(value) is not int):
            raise ManifestError(f"{self.where}.{key} must be an integer, got {value!r:.60}")
        if kind is float and not (isinstance(value, (int, float)) and math.isfinite(value)):
            raise ManifestError(f"{self.where}.{key} must be a number")
        if not isinstance(value, kind):
            raise ManifestError(
                f"{self.where}.{key} must be {kind.__name__}, got {type(value).__name__}"
            )
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: Any = _MISSING) -> str:
        value = self.get(key, str, default=default)
        if value not in allowed:
            raise ManifestError(f"{self.where}.{key} {value!r:.40} is not one of {list(allowed)}")
        return value

    def child(self, key: str) -> _Reader:
        return _Reader(self.get(key, dict), f"{self.where}.{key}")

    def build(self, fn: Any) -> Any:
        return fn(self)

    def each(self, key: str, fn: Any, default: Any = _MISSING) -> Iterator[Any]:
        items = self.get(key, list, default=default)
        for index, item in enumerate(items):
            yield fn(_Reader(item, f"{self.where}.{key}[{index}]"))

    def mapping(self, fn: Any) -> dict[str, Any]:
        return {
            _relative_path(name, f"{self.where} key"): fn(_Reader(v, f"{self.where}[{name!r}]"))
            for name, v in self.raw.items()
        }


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
