"""The torch-free description layer: shape grammar, dtype names, --config, manifest JSON."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from qkan_pack import FORMAT_VERSION, IncompatibleArtifactError, ManifestError, ShapeSpecError
from qkan_pack.format import (
    LAYOUTS,
    MAX_DIM,
    MAX_MANIFEST_BYTES,
    MAX_RANK,
    MAX_SHAPES,
    CapturePolicy,
    FileEntry,
    InputDecl,
    KernelSet,
    LayoutFigures,
    Manifest,
    Metadata,
    ModelInfo,
    OutputClass,
    OutputNode,
    PaddedAxis,
    Padding,
    PrecisionChoice,
    PrecisionPolicy,
    RowProof,
    ShapeEntry,
    TensorSpec,
    check_dtype,
    dumps_manifest,
    loads_strict,
    manifest_to_dict,
    parse_config_items,
    parse_manifest,
    parse_shape,
    parse_shapes,
)

SHA = "ab" * 32
GOLDEN = Path(__file__).parents[1] / "golden"


def sample_manifest() -> Manifest:
    """A valid manifest with two inputs, nested outputs, includes, tied weights and kernels."""
    leaf = OutputNode("tensor", tensor=TensorSpec((2, 3), "float32"))
    outputs = OutputNode("dict", keys=("y", "parts", "extra"), items=(
        leaf,
        OutputNode("tuple", items=(OutputNode("tensor", tensor=TensorSpec((2,), "float32")),
                                   OutputNode("list", items=(leaf,)))),
        OutputNode("none"),
    ), cls=OutputClass("transformers.modeling_outputs", "BaseModelOutput", "mapping"))
    files = {name: FileEntry(size=10, sha256=SHA) for name in (
        "source/model.py", "source/helper.py", "weights.safetensors",
        "references/shape-000.safetensors", "references/shape-001.safetensors", "kernels/k/a.bin")}
    return Manifest(
        producer={"qkan_pack": "0.1.0", "torch": "2.13.0", "qkan": None, "python": "3.11.7"},
        model=ModelInfo(source="source/model.py", entry="build_model",
                        config={"width": [2, 3], "solver": "exact", "scale": 0.5},
                        includes=("source/helper.py",), parameters=42,
                        tied=(("head.weight", "emb.weight"),), device_argument=True,
                        packages={"transformers": "5.0.0"}),
        call="keyword",
        inputs=(InputDecl("a", "float32"), InputDecl("b", "int64", 0, 8, "embedding table (8 rows)")),
        shapes=(
            ShapeEntry((("a", (2, 3)), ("b", (2, 4))), outputs, "references/shape-000.safetensors",
                       noise=1.2e-07),
            ShapeEntry((("a", (8, 3)), ("b", (8, 4))), outputs, "references/shape-001.safetensors"),
        ),
        capture=CapturePolicy("submodules", ("QKANLayer",)),
        files=files,
        kernels=(KernelSet("sm90-triton", "kernels/k", {"triton": "3.4"}),),
    )


def sample_dict() -> dict[str, Any]:
    return manifest_to_dict(sample_manifest())


def encode(raw: dict[str, Any]) -> bytes:
    return json.dumps(raw).encode()


# ---------------------------------------------------------------------------
# Shape grammar
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("1x128,8x128", [(1, 128), (8, 128)]),
    ("8X128", [(8, 128)]),
    (" 1 x 2 , 4 x 2 ", [(1, 2), (4, 2)]),
    ("7", [(7,)]),
    ("1x2x3x4x5x6x7x8", [(1, 2, 3, 4, 5, 6, 7, 8)]),
    ("007x2", [(7, 2)]),
    (f"{MAX_DIM}", [(MAX_DIM,)]),
])
def test_parse_shapes_accepts(text: str, expected: list[tuple[int, ...]]) -> None:
    assert parse_shapes(text) == expected


@pytest.mark.parametrize(("text", "says"), [
    ("", "empty"),
    ("   ", "empty"),
    ("1x0", "positive"),
    ("0", "positive"),
    ("-1x2", "bad dimension"),
    ("1.5x2", "bad dimension"),
    ("axb", "bad dimension"),
    ("1x", "bad dimension"),
    ("x2", "bad dimension"),
    ("1x2,", "empty shape"),
    ("1x2,,4x2", "empty shape"),
    ("1*2", "bad dimension"),
    ("1x2;4x2", "bad dimension"),
    ("１x2", "bad dimension"),  # full-width digit: not ASCII
    ("1x2,4x2x1", "mix ranks"),
    ("1x2,1x2", "listed twice"),
    ("1x2x3x4x5x6x7x8x9", f"at most {MAX_RANK}"),
    (f"{MAX_DIM + 1}", "exceeds"),
    ("9" * 5000, "exceeds"),  # would hit int()'s 4300-digit limit: still a ShapeSpecError
])
def test_parse_shapes_refuses_with_reason(text: str, says: str) -> None:
    with pytest.raises(ShapeSpecError, match=says):
        parse_shapes(text)


def test_parse_shapes_caps_count() -> None:
    text = ",".join(f"{i}x2" for i in range(1, MAX_SHAPES + 2))
    with pytest.raises(ShapeSpecError, match=f"at most {MAX_SHAPES}"):
        parse_shapes(text)
    assert len(parse_shapes(",".join(f"{i}x2" for i in range(1, MAX_SHAPES + 1)))) == MAX_SHAPES


@pytest.mark.parametrize("value", [None, 12, b"1x2", ["1x2"]])
def test_parse_shape_refuses_non_text(value: Any) -> None:
    with pytest.raises(ShapeSpecError):
        parse_shape(value)
    with pytest.raises(ShapeSpecError):
        parse_shapes(value)


def test_shape_spec_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_shapes("nope")


# ---------------------------------------------------------------------------
# dtype names and --config
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "canonical"), [
    ("float32", "float32"), ("float", "float32"), ("torch.float32", "float32"),
    (" Float32 ", "float32"), ("half", "float16"), ("double", "float64"), ("long", "int64"),
    ("int", "int32"), ("bfloat16", "bfloat16"), ("uint8", "uint8"), ("bool", "bool"),
    ("int64", "int64"),
])
def test_check_dtype_canonical(name: str, canonical: str) -> None:
    assert check_dtype(name) == canonical


@pytest.mark.parametrize("name", ["", "float128", "complex64", "f32", "torch.", "int 64", None, 32])
def test_check_dtype_refuses_and_lists_choices(name: Any) -> None:
    with pytest.raises(ShapeSpecError) as info:
        check_dtype(name)
    if isinstance(name, str):
        assert "float32" in str(info.value) and "int64" in str(info.value)


def test_parse_config_items_json_else_text() -> None:
    config = parse_config_items([
        "width=[64,64]", "reps=3", "solver=exact", "scale=0.5", "flag=true", "none=null",
        "nested={\"a\": [1, 2]}", "text=\"quoted\"", "empty=", "eq=a=b", " spaced = 7",
    ])
    assert config == {
        "width": [64, 64], "reps": 3, "solver": "exact", "scale": 0.5, "flag": True,
        "none": None, "nested": {"a": [1, 2]}, "text": "quoted", "empty": "", "eq": "a=b",
        "spaced": 7,
    }


@pytest.mark.parametrize(("items", "says"), [
    (["novalue"], "KEY=VALUE"),
    (["=3"], "KEY=VALUE"),
    (["1x=3"], "identifier"),
    (["a-b=3"], "identifier"),
    (["a=1", "a=2"], "twice"),
])
def test_parse_config_items_refuses(items: list[str], says: str) -> None:
    with pytest.raises(ShapeSpecError, match=says):
        parse_config_items(items)


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e999", "a[0]"])
def test_config_values_that_json_would_mangle_stay_text(raw: str) -> None:
    """Non-finite numbers could not round-trip through the manifest; they stay text."""
    assert parse_config_items([f"x={raw}"]) == {"x": raw}


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(("raw", "says"), [
    (_nested(65), "deeper than 64"),
    (_nested(100_000), "invalid JSON"),  # RecursionError inside json, turned into a refusal
    ('{"a": 1, "a": 2}', "duplicate JSON key"),
    ("[1, NaN]", "NaN"),
    ("[abc", "looks like JSON"),  # quote it ('"[abc"') to pass the text
])
def test_config_values_that_look_like_json_but_are_refused_are_usage_errors(raw: str,
                                                                           says: str) -> None:
    """Round 2, finding 9: deep --config values silently became strings (the factory then got
    text instead of the nested list it was written for)."""
    with pytest.raises(ShapeSpecError, match=says):
        parse_config_items([f"x={raw}"])


# ---------------------------------------------------------------------------
# Manifest JSON
# ---------------------------------------------------------------------------


def test_manifest_round_trip_is_exact() -> None:
    manifest = sample_manifest()
    data = dumps_manifest(manifest)
    parsed = parse_manifest(data)
    assert parsed == manifest
    assert dumps_manifest(parsed) == data
    assert parse_manifest(data.decode()) == manifest  # text as well as bytes
    assert parsed.input_names == ("a", "b")
    assert parsed.input_dtype("b") == "int64"
    assert dict(parsed.shapes[1].inputs)["a"] == (8, 3)
    assert [leaf.shape for leaf in parsed.shapes[0].outputs.leaves()] == [(2, 3), (2,), (2, 3)]
    assert parsed.shapes[0].label == "a:2x3,b:2x4"
    assert parsed.shapes[0].outputs.label == (
        "BaseModelOutput{y: 2x3 float32, parts: (2 float32, [2x3 float32]), extra: None}")
    assert parsed.call == "keyword" and parsed.inputs[1].high == 8
    assert b'"created"' not in data  # reproducible builds: nothing time-dependent


def test_manifest_optional_fields_default() -> None:
    raw = sample_dict()
    for key in ("reference_device", "reference_precision", "kernels"):
        del raw[key]
    for key in ("includes", "config", "device_argument", "parameters", "tied"):
        del raw["model"][key]
    raw["files"].pop("source/helper.py")
    parsed = parse_manifest(encode(raw))
    assert parsed.reference_device == "cpu"
    assert parsed.kernels == () and parsed.model.includes == () and parsed.model.config == {}


def test_reference_noise_is_optional_and_checked() -> None:
    """A shape's float32 noise sets how tight its self-test is: absent (an artifact from
    before it was measured) means the fixed tolerance; anything but a number in [0, 1] is
    a corrupt manifest."""
    raw = sample_dict()
    assert raw["shapes"][0]["noise"] == 1.2e-07 and "noise" not in raw["shapes"][1]
    assert parse_manifest(encode(raw)).shapes[1].noise is None
    for bad in (-1e-7, 2, True, "1e-7", [1e-7]):
        raw["shapes"][0]["noise"] = bad
        with pytest.raises(ManifestError, match=r"shapes\[0\]\.noise must be a number"):
            parse_manifest(encode(raw))
    entry = sample_manifest().shapes[0]  # nor can a writer make one (hand re-signing)
    for bad in (float("nan"), float("inf"), -1e-9):
        with pytest.raises(ManifestError, match="noise must be a number in"):
            ShapeEntry(entry.inputs, entry.outputs, entry.reference, noise=bad)


def test_duplicate_json_keys_refused() -> None:
    data = dumps_manifest(sample_manifest()).decode()
    version = f'"format_version": {parse_manifest(data).format_version},'
    doubled = data.replace(version, version + " " + version, 1)
    assert doubled != data
    with pytest.raises(ManifestError, match="duplicate JSON key 'format_version'"):
        parse_manifest(doubled)
    nested = data.replace('"entry": "build_model",', '"entry": "build_model", "entry": "evil",', 1)
    with pytest.raises(ManifestError, match="duplicate JSON key 'entry'"):
        parse_manifest(nested)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
def test_non_finite_numbers_refused(constant: str) -> None:
    data = dumps_manifest(sample_manifest()).decode().replace('"scale": 0.5', f'"scale": {constant}')
    with pytest.raises(ManifestError):
        parse_manifest(data)
    with pytest.raises(ManifestError):
        loads_strict(constant)


def test_oversize_manifest_refused() -> None:
    data = dumps_manifest(sample_manifest())
    padded = data[:-2] + b" " * (MAX_MANIFEST_BYTES + 1 - len(data)) + data[-2:]
    assert len(padded) > MAX_MANIFEST_BYTES
    with pytest.raises(ManifestError, match="limit"):
        parse_manifest(padded)
    fits = data[:-2] + b" " * (MAX_MANIFEST_BYTES - len(data)) + data[-2:]
    assert parse_manifest(fits) == sample_manifest()


def test_newer_format_version_says_upgrade() -> None:
    raw = sample_dict()
    raw["format_version"] = FORMAT_VERSION + 1
    with pytest.raises(IncompatibleArtifactError, match="upgrade qkan-pack"):
        parse_manifest(encode(raw))
    raw["format_version"] = 10**6
    with pytest.raises(IncompatibleArtifactError, match="upgrade qkan-pack"):
        parse_manifest(encode(raw))


@pytest.mark.parametrize("version", [0, -1, "1", 1.0, True, None])
def test_invalid_format_versions_refused(version: Any) -> None:
    raw = sample_dict()
    raw["format_version"] = version
    with pytest.raises(ManifestError) as info:
        parse_manifest(encode(raw))
    assert not isinstance(info.value, IncompatibleArtifactError)


def test_other_format_name_refused() -> None:
    raw = sample_dict()
    raw["format"] = "skops"
    with pytest.raises(ManifestError, match="not a qkan-pack manifest"):
        parse_manifest(encode(raw))


BAD_PATHS = ["../evil.py", "source/../../evil.py", "/etc/passwd", "source\\model.py",
             "C:\\model.py", "source//model.py", "./model.py", "source/./model.py", "", "a\x00b",
             "x" * 300]


@pytest.mark.parametrize("path", BAD_PATHS)
def test_paths_leaving_the_artifact_refused_everywhere(path: str) -> None:
    places = {
        "files": lambda raw: raw["files"].__setitem__(path, {"size": 1, "sha256": SHA}),
        "source": lambda raw: raw["model"].__setitem__("source", path),
        "includes": lambda raw: raw["model"].__setitem__("includes", [path]),
        "reference": lambda raw: raw["shapes"][0].__setitem__("reference", path),
        "kernels": lambda raw: raw["kernels"][0].__setitem__("directory", path),
    }
    for where, edit in places.items():
        raw = sample_dict()
        edit(raw)
        with pytest.raises(ManifestError, match=r"stay inside|not listed"):
            parse_manifest(encode(raw))
        assert (path in raw["files"]) == (where == "files")


def mutate(path: tuple[Any, ...], value: Any) -> bytes:
    raw = sample_dict()
    target = raw
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return encode(raw)


DELETE = object()


CLASHING_OUTPUTS = {"dict": {"a.b": {"tensor": {"shape": [2], "dtype": "float32"}},
                             "a": {"dict": {"b": {"tensor": {"shape": [2], "dtype": "float32"}}}}}}


@pytest.mark.parametrize(("path", "value", "where", "says"), [
    (("inputs",), [], "manifest.inputs", "must have 1 or more entries, got 0"),
    (("inputs", 1, "name"), "a", "manifest.inputs[1]", "repeats the name of manifest.inputs[0]"),
    (("inputs", 0, "name"), "not ok", "manifest.inputs[0].name", "must be an identifier"),
    (("inputs", 0, "name"), "a\n", "manifest.inputs[0].name", "must be an identifier"),
    (("inputs", 0, "dtype"), "float128", "manifest.inputs[0].dtype",
     'must be one of float16, bfloat16, float32, float64, uint8, int8, int16, int32, int64, '
     'bool, got "float128"'),
    (("shapes",), [], "manifest.shapes", "must have 1 to 256 entries, got 0"),
    (("shapes", 0, "inputs", "a"), [0, 3], "manifest.shapes[0].inputs.a[0]",
     "must be an integer in [1, 2147483647], got 0"),
    (("shapes", 0, "inputs", "a"), [3, True], "manifest.shapes[0].inputs.a[1]", "got true"),
    (("shapes", 0, "inputs", "a"), [], "manifest.shapes[0].inputs.a", "must have 1 to 8 entries"),
    (("shapes", 0, "inputs", "a"), [1] * 9, "manifest.shapes[0].inputs.a", "1 to 8 entries"),
    (("shapes", 0, "inputs"), {"a": [2, 3]}, "manifest.shapes[0].inputs",
     'names ["a"], which differ from manifest.inputs ["a", "b"]'),
    (("shapes", 1, "inputs"), {"a": [2, 3], "b": [2, 4]}, "manifest.shapes[1]",
     "repeats the input shapes of manifest.shapes[0]"),
    (("shapes", 1, "inputs"), {"b": [2, 4], "a": [2, 3]}, "manifest.shapes[1]",
     "repeats the input shapes of manifest.shapes[0]"),  # in another key order too
    (("shapes", 0, "outputs"), {}, "manifest.shapes[0].outputs", "must have exactly one of"),
    (("shapes", 0, "outputs"), {"set": []}, "manifest.shapes[0].outputs.set",
     "unknown output kind"),
    (("shapes", 0, "outputs"), {"tensor": {"shape": [2, -1], "dtype": "float32"}},
     "manifest.shapes[0].outputs.tensor.shape[1]", "must be a non-negative integer, got -1"),
    (("shapes", 0, "outputs"), {"tuple": [1]}, "manifest.shapes[0].outputs.tuple[0]",
     "must be a JSON object, got 1"),
    (("shapes", 0, "outputs"), {"none": 0}, "manifest.shapes[0].outputs.none",
     "must be null, got 0"),
    (("shapes", 0, "outputs"), {"tensor": {"shape": [2], "dtype": "float32"},
                                "class": {"module": "m", "qualname": "Q", "form": "mapping"}},
     "manifest.shapes[0].outputs.class", "mapping does not fit a tensor output"),
    (("shapes", 0, "outputs"), CLASHING_OUTPUTS, "manifest.shapes[0].outputs",
     "give output['a.b'] and output['a']['b'] one name, output.a.b"),
    (("shapes", 0, "outputs", "class", "module"), "os system", "manifest.shapes[0].outputs.class.module",
     "must be a dotted Python name"),
    (("shapes", 0, "reference"), "references/absent.safetensors", "manifest.shapes[0].reference",
     "not listed in manifest.files"),
    (("model", "entry"), "build model", "manifest.model.entry", "must be a Python identifier"),
    (("model", "entry"), "os.system", "manifest.model.entry", "must be a Python identifier"),
    (("model", "source"), "source/absent.py", "manifest.model.source", "not listed"),
    (("model", "includes"), ["source/helper.py", 7], "manifest.model.includes[1]",
     "must be text, got 7"),
    (("model", "tied"), [["a", 1]], "manifest.model.tied[0][1]", "must be text, got 1"),
    (("model", "config"), [1], "manifest.model.config", "must be a JSON object, got [1]"),
    (("capture", "policy"), "always", "manifest.capture.policy",
     'must be one of auto, full, submodules, got "always"'),
    (("capture", "submodules"), ["not a class"], "manifest.capture.submodules[0]",
     "must be a class name"),
    (("files", "weights.safetensors"), DELETE, "manifest.files", "does not list weights.safetensors"),
    (("files", "model.sig"), {"size": 1, "sha256": SHA}, "manifest.files['model.sig']",
     "is reserved"),
    (("files", "weights.safetensors", "sha256"), "AB" * 32,
     "manifest.files['weights.safetensors'].sha256", "must be 64 lowercase hex"),
    (("files", "weights.safetensors", "sha256"), SHA + "\n",
     "manifest.files['weights.safetensors'].sha256", "must be 64 lowercase hex"),
    (("files", "weights.safetensors", "size"), -1, "manifest.files['weights.safetensors'].size",
     "must be a non-negative integer, got -1"),
    (("files", "weights.safetensors", "size"), 1.5, "manifest.files['weights.safetensors'].size",
     "must be a non-negative integer, got 1.5"),
    (("producer",), "me", "manifest.producer", 'must be a JSON object, got "me"'),
    (("producer", "torch"), 2, "manifest.producer.torch", "must be text or null, got 2"),
    (("kernels", 0, "details"), {"triton": [3]}, "manifest.kernels[0].details.triton",
     "must be text"),
    (("model",), DELETE, "manifest.model", "is missing"),
    (("call",), DELETE, "manifest.call", "is missing"),
    (("inputs", 1, "range"), [8, 0], "manifest.inputs[1].range", "must be [low, high] with low < high"),
    (("inputs", 1, "range"), DELETE, "manifest.inputs[1].range_source", "is given without a range"),
])
def test_invalid_fields_name_the_field(path: tuple[Any, ...], value: Any, where: str,
                                       says: str) -> None:
    """Every refusal names the JSON path of the value refused (``ManifestError.where``); the
    message is that path and the problem."""
    with pytest.raises(ManifestError) as info:
        parse_manifest(mutate(path, value))
    assert info.value.where == where
    assert says in info.value.problem
    assert str(info.value) == f"{where} {info.value.problem}"


def rich_manifest() -> Manifest:
    """``sample_manifest`` with every optional part: a row proof, declared padding, reduced
    precision with a device's choice (per shape, channels-last graphs among them), metadata."""
    manifest = sample_manifest()
    first = dataclasses.replace(manifest.shapes[0], rows=RowProof(True, "rows alone agree"),
                                precision_error={"bf16": 0.004, "tf32": None})
    choice = PrecisionChoice("sm90", "bf16", latency_us={"fp32": (2.0, 3.0), "bf16": (1.0, 2.0)},
                             error={"bf16": (0.001, 0.002)}, refused={"fp16": "overflow"},
                             shapes=("fp32", "bf16"), shape_layouts=("contiguous", "channels_last"),
                             channels_last=LayoutFigures(latency_us={"bf16": (1.5, 1.0)},
                                                         error={"bf16": (0.001, 0.002)},
                                                         refused={"fp32": "a reason"}))
    return dataclasses.replace(
        manifest, shapes=(first, manifest.shapes[1]),
        padding=Padding(values={"a": 0.0, "b": 0}, axes=(PaddedAxis((("a", 0), ("b", 0))),)),
        precision=PrecisionPolicy("fp32", 1e-2, ("fp32", "bf16"), (choice,), LAYOUTS),
        metadata=Metadata(name="m", labels={"team": "search"}))


def test_a_manifest_with_every_optional_part_round_trips_exactly() -> None:
    data = dumps_manifest(rich_manifest())
    assert parse_manifest(data) == rich_manifest() and dumps_manifest(parse_manifest(data)) == data


def _located(raw: dict[str, Any]) -> ManifestError:
    with pytest.raises(ManifestError) as info:
        parse_manifest(encode(raw))
    return info.value


def _refused_rich(path: tuple[Any, ...], value: Any) -> ManifestError:
    """The refusal of ``rich_manifest``'s JSON with ``value`` set at ``path``."""
    raw = manifest_to_dict(rich_manifest())
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return _located(raw)


#: Every object the format defines (by its path in the JSON), the path a key added there is
#: refused at, and what the refusal says.
OBJECTS = [
    ((), "manifest.surprise", "is not a key this format version defines here (known: format, "
                              "created, metadata, producer, model, call, inputs"),
    (("model",), "manifest.model.surprise", "(known: source, includes, entry, config,"),
    (("inputs", 1), "manifest.inputs[1].surprise", "(known: name, dtype, range, range_source)"),
    (("shapes", 0), "manifest.shapes[0].surprise", "(known: inputs, outputs, reference, noise,"),
    (("shapes", 0, "outputs", "dict", "y", "tensor"),
     "manifest.shapes[0].outputs.dict.y.tensor.surprise", "(known: shape, dtype)"),
    (("shapes", 0, "outputs", "class"), "manifest.shapes[0].outputs.class.surprise",
     "(known: module, qualname, form)"),
    (("shapes", 0, "outputs"), "manifest.shapes[0].outputs", "must have exactly one of"),
    (("shapes", 0, "rows"), "manifest.shapes[0].rows.surprise", "(known: independent, detail)"),
    (("capture",), "manifest.capture.surprise", "(known: policy, submodules)"),
    (("kernels", 0), "manifest.kernels[0].surprise", "(known: key, directory, details)"),
    (("files", "weights.safetensors"), "manifest.files['weights.safetensors'].surprise",
     "(known: size, sha256)"),
    (("padding",), "manifest.padding.surprise", "(known: values, axes)"),
    (("padding", "axes", 0), "manifest.padding.axes[0].surprise", "(known: inputs, outputs)"),
    (("precision",), "manifest.precision.surprise", "(known: default, max_error, allowed,"
                                                    " layouts, choices)"),
    (("precision", "choices", 0), "manifest.precision.choices[0].surprise",
     "(known: key, precision, details, latency_us, error, refused, shapes, layout, "
     "shape_layouts, channels_last)"),
    (("precision", "choices", 0, "channels_last"),
     "manifest.precision.choices[0].channels_last.surprise", "(known: latency_us, error, "
                                                             "refused)"),
    (("metadata",), "manifest.metadata", "has unknown keys ['surprise']"),
]


@pytest.mark.parametrize(("path", "where", "says"), OBJECTS, ids=lambda v: str(v)[:50])
def test_an_unknown_key_is_refused_in_every_object_of_the_format(path: tuple[Any, ...],
                                                                 where: str, says: str) -> None:
    """One policy everywhere: a key this format version does not define is refused, named by
    its path (a newer producer's key comes with a newer format version: docs/artifacts.md)."""
    error = _refused_rich((*path, "surprise"), 1)
    assert error.where == where and says in str(error)


def test_free_form_maps_keep_any_key() -> None:
    """Maps of names are data, not format keys: the producer's versions, the factory's
    config, packages, kernel details and labels take any name and keep it."""
    raw = manifest_to_dict(rich_manifest())
    raw["producer"]["cuda"] = "12.4"
    raw["model"]["config"]["new_option"] = {"nested": [1, None]}
    raw["model"]["packages"]["timm"] = "1.0.0"
    raw["kernels"][0]["details"]["nvcc"] = "12.4"
    raw["metadata"]["labels"]["owner"] = "me"
    parsed = parse_manifest(encode(raw))
    assert parsed.producer["cuda"] == "12.4" and parsed.model.config["new_option"] == {
        "nested": [1, None]}
    assert parsed.model.packages["timm"] == "1.0.0" and parsed.kernels[0].details["nvcc"] == "12.4"
    assert parse_manifest(dumps_manifest(parsed)) == parsed


def test_a_newer_format_is_refused_by_its_version_before_its_keys() -> None:
    """A newer producer's keys come with its format version: the refusal says to upgrade,
    not that a key is unknown."""
    raw = sample_dict()
    raw["format_version"] = FORMAT_VERSION + 1
    raw["shapes"][0]["future_key"] = {"x": 1}
    with pytest.raises(IncompatibleArtifactError, match="upgrade qkan-pack") as info:
        parse_manifest(encode(raw))
    assert info.value.where == "manifest.format_version"


def test_format_1_reads_its_own_keys_and_nothing_else() -> None:
    """Format 1 (tests/golden) keeps reading, its build time included (and kept when written
    back); a key it never had is refused."""
    raw = json.loads((GOLDEN / "v1_multi_io" / "manifest.json").read_bytes())
    manifest = parse_manifest(encode(raw))
    assert manifest.format_version == 1 and manifest.created and manifest.call == "positional"
    assert parse_manifest(dumps_manifest(manifest)) == manifest
    assert _located({**raw, "surprise": 1}).where == "manifest.surprise"


def test_manifest_error_carries_where_and_problem_and_survives_pickling() -> None:
    raw = sample_dict()
    raw["shapes"][1]["outputs"]["dict"]["parts"]["tuple"][1]["list"][0]["tensor"]["shape"] = [2, -3]
    error = _located(raw)
    where = "manifest.shapes[1].outputs.dict.parts.tuple[1].list[0].tensor.shape[1]"
    assert (error.where, error.problem) == (where, "must be a non-negative integer, got -3")
    assert str(error) == f"{where} must be a non-negative integer, got -3"
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.where, copy.problem, str(copy)) == (ManifestError, error.where,
                                                                error.problem, str(error))
    assert ManifestError("not JSON").where is None  # refusals of no path keep their text


def test_a_dataclass_rule_names_its_field_in_python_and_its_path_when_read() -> None:
    """Rules a dataclass checks itself (also for objects built in Python) name the field
    relative to it; the reader puts the object's path in front."""
    with pytest.raises(ManifestError) as info:
        dataclasses.replace(sample_manifest().shapes[0], noise=2.0)
    assert (info.value.where, str(info.value)) == ("noise",
                                                   "noise must be a number in [0, 1], got 2.0")
    raw = sample_dict()
    raw["shapes"][0]["rows"] = {"independent": True, "detail": "x" * 401}
    assert _located(raw).where == "manifest.shapes[0].rows.detail"
    assert _refused_rich(("precision", "default"), "tf32").where == "manifest.precision.default"


def test_a_padding_axis_an_entry_lacks_is_refused_not_a_crash() -> None:
    """A re-hashed manifest whose padding names a dimension one entry does not have (the
    entries differ in rank): an IndexError escaped the reader."""
    raw = manifest_to_dict(rich_manifest())
    raw["padding"]["axes"] = [{"inputs": [["a", 1]], "outputs": []}]
    raw["shapes"][1]["inputs"]["a"] = [8]
    error = _located(raw)
    assert error.where == "manifest.padding.axes[0].inputs[0]"
    assert "names dim 1 of a, which shape a:8,b:8x4 does not have" in error.problem


@pytest.mark.parametrize(("path", "value", "where", "says"), [
    (("padding", "values", "c"), 0, "manifest.padding.values.c", "is not an input"),
    (("padding", "values", "b"), 2**63, "manifest.padding.values.b",
     "must be an integer from -9223372036854775808 to 9223372036854775807 (int64)"),
    (("padding", "values", "a"), "0", "manifest.padding.values.a",
     'must be a number, true or false, got "0"'),
    (("padding", "values"), {}, "manifest.padding.values", "must have 1 or more keys"),
    (("padding", "axes"), [], "manifest.padding.axes", "must have 1 or more entries"),
    (("padding", "axes", 0, "inputs", 1), ["b", 5], "manifest.padding.axes[0].inputs[1]",
     "names dim 5 of b, which shape a:2x3,b:2x4 does not have"),
    (("padding", "axes", 0, "inputs", 1), ["c", 0], "manifest.padding.axes[0].inputs[1]",
     "must be a padded input's dimension"),
    (("padding", "axes", 0, "inputs", 1), ["a", 0], "manifest.padding.axes[0].inputs[1]",
     "each listed once"),
    (("padding", "axes", 0, "inputs", 1), ["b"], "manifest.padding.axes[0].inputs[1]",
     "must be a [text, a non-negative integer] pair"),
    (("padding", "axes", 0, "outputs"), [[0, 3]], "manifest.padding.axes[0].outputs[0]",
     "names output 0 dim 3, which shape a:2x3,b:2x4 does not have"),
    (("padding", "axes", 0, "outputs"), [[3, 0]], "manifest.padding.axes[0].outputs[0]",
     "names output 3 dim 0"),
    (("padding", "axes", 0, "outputs"), [[1, 0]], "manifest.padding.axes[0].outputs[0]",
     "says output 1 dim 0 follows axis a dim 0, b dim 0, but it is not the axis's size"),
])
def test_malformed_padding_is_refused_by_path(path: tuple[Any, ...], value: Any, where: str,
                                              says: str) -> None:
    error = _refused_rich(path, value)
    assert error.where == where and says in error.problem


HUGE = 10**400  # JSON holds it as an integer; a float cannot


@pytest.mark.parametrize(("path", "where", "says"), [
    (("shapes", 0, "noise"), "manifest.shapes[0].noise", "must be a number or null"),
    (("shapes", 0, "precision_error", "bf16"), "manifest.shapes[0].precision_error.bf16",
     "must be a non-negative number or null"),
    (("precision", "max_error"), "manifest.precision.max_error", "must be a number"),
    (("precision", "choices", 0, "latency_us", "bf16", 1),
     "manifest.precision.choices[0].latency_us.bf16[1]", "must be a non-negative number"),
    (("padding", "values", "a"), "manifest.padding.values.a",
     "must be a finite number within ±3.40282e+38 (float32)"),
])
def test_an_integer_beyond_a_floats_range_is_refused_not_a_crash(path: tuple[Any, ...],
                                                                  where: str, says: str) -> None:
    """An OverflowError (``math.isfinite`` of a 400-digit integer) escaped the reader for
    every float field but the noise."""
    error = _refused_rich(path, HUGE)
    assert error.where == where and says in error.problem and len(str(error)) < 200


def test_a_pad_value_beyond_a_floats_range_is_a_usage_error() -> None:
    from qkan_pack.format import check_pad_value

    with pytest.raises(ShapeSpecError, match=r"--pad x: pad value 1000.*… must be a finite"):
        check_pad_value(HUGE, "float32", "--pad x", ShapeSpecError)


def test_deep_output_nesting_refused() -> None:
    node: dict[str, Any] = {"tensor": {"shape": [2, 3], "dtype": "float32"}}
    for _ in range(20):
        node = {"tuple": [node]}
    with pytest.raises(ManifestError, match="deeper"):
        parse_manifest(mutate(("shapes", 0, "outputs"), node))


@pytest.mark.parametrize("data", [b"", b"[]", b"null", b"\xff\xfe\x00", b"{", b"[" * 100_000,
                                  b'{"a":' * 100_000])
def test_garbage_is_a_manifest_error(data: bytes) -> None:
    with pytest.raises(ManifestError):
        parse_manifest(data)


def test_manifest_dataclasses_are_frozen() -> None:
    manifest = sample_manifest()
    with pytest.raises(AttributeError):
        manifest.format_version = 2  # type: ignore[misc]
    assert copy.deepcopy(manifest) == manifest


@pytest.mark.parametrize("value", [(10**400, 1), (0, -10**400), ("a", 1), (1,), "x"])
def test_an_input_range_that_is_not_two_floats_is_a_shape_spec_error(value: Any) -> None:
    """Audit: an int beyond float's range escaped as OverflowError (the grammar promises
    ShapeSpecError for every bad text or value)."""
    from qkan_pack.format import check_range

    with pytest.raises(ShapeSpecError, match="two numbers"):
        check_range(value)


def test_an_integer_range_must_fit_the_dtype() -> None:
    """Audit (found while testing bench-serve): ``--input-range -3,300`` for a uint8 input
    crashed the build inside ``torch.randint`` ("from is out of bounds for unsigned char")."""
    import numpy as np

    from qkan_pack.format import DTYPES, check_range

    for name, dtype in DTYPES.items():
        if dtype.kind == "int":
            assert dtype.int_limits == (np.iinfo(name).min, np.iinfo(name).max), name
        else:
            assert dtype.int_limits is None, name
    assert check_range((0, 256), ["uint8"]) == (0.0, 256.0)
    assert check_range((-128, 128), ["int8", "float32"]) == (-128.0, 128.0)
    for bad, dtype in (((-3, 300), "uint8"), ((-129, 0), "int8"), ((0, 2**15 + 1), "int16")):
        with pytest.raises(ShapeSpecError, match=f"does not fit {dtype} inputs"):
            check_range(bad, [dtype])


def test_a_float_range_must_fit_every_float_input() -> None:
    """Audit (issue 32): float inputs now draw from ``--input-range``; a range beyond what
    their dtype holds would draw infinities."""
    import numpy as np

    from qkan_pack.format import DTYPES, check_range

    for name, dtype in DTYPES.items():
        if name != "bfloat16" and dtype.kind == "float":
            assert dtype.largest == float(np.finfo(name).max), name
        assert dtype.itemsize == (2 if name == "bfloat16" else np.dtype(name).itemsize), name
    assert check_range((-65504, 65504), ["float16"]) == (-65504.0, 65504.0)
    assert check_range((-1e300, 1e300), ["float64"]) == (-1e300, 1e300)
    for bad, dtype in (((0, 1e5), "float16"), ((-1e39, 0), "float32"), ((0, 1e39), "bfloat16")):
        with pytest.raises(ShapeSpecError, match=f"does not fit {dtype} inputs"):
            check_range(bad, ["float64", dtype])


@pytest.mark.parametrize(("value", "says"), [
    (2**63, "outside 0..9223372036854775807"), (-1, "outside"), (10**23, "outside"),
    pytest.param(10**5000, "a 16610-bit integer", id="5001-digits"),
    (1e23, "must be an integer"), (1.0, "must be an integer"),
    ("3", "must be an integer"), (True, "not a boolean"), (None, "must be an integer"),
])
def test_a_seed_torch_would_refuse_is_a_shape_spec_error(value: Any, says: str) -> None:
    """Audit (issue 32): ``--seed 100000000000000000000000`` ended as "unexpected ValueError:
    Overflow when unpacking long long"; a float seed as a RuntimeError from torch."""
    from qkan_pack.format import MAX_SEED, check_seed

    with pytest.raises(ShapeSpecError, match=says):
        check_seed(value)
    assert check_seed(0) == 0 and check_seed(MAX_SEED) == MAX_SEED == 2**63 - 1


def test_reference_inputs_beyond_the_byte_limit_are_refused_naming_the_shape() -> None:
    """Audit (issue 32): ``--shapes 2147483647x2147483647`` ended as an unexpected
    RuntimeError from torch, and ``1x2147483647`` allocated 8 GiB for 25 s before failing."""
    from qkan_pack.format import MAX_REFERENCE_BYTES, check_reference_bytes

    assert MAX_REFERENCE_BYTES == 2**30
    check_reference_bytes([{"x": (2**28,)}], {"x": "float32"})  # exactly 1 GiB
    with pytest.raises(ShapeSpecError, match=r"shape x 1x2147483647 \(float32\) needs 8 GiB "
                                             r"of reference inputs; .* at most 1 GiB"):
        check_reference_bytes([{"x": (1, 2**31 - 1)}], {"x": "float"})
    with pytest.raises(ShapeSpecError, match=r"needs 16 EiB"):
        check_reference_bytes([{"x": (2**31 - 1, 2**31 - 1)}], {"x": "float32"})
    with pytest.raises(ShapeSpecError, match=r"shape ids 4x2 \(int64\), mask 4x2 \(bool\) "
                                             r"needs 72 B of reference inputs after 1024 MiB"):
        check_reference_bytes([{"ids": (2**27 - 1, 1), "mask": (1, 1)},
                               {"ids": (4, 2), "mask": (4, 2)}], {"ids": "int64", "mask": "bool"})


def test_config_takes_pythons_spellings_of_true_false_and_none() -> None:
    """Audit (issue 32): ``--config bias=False`` passed the truthy string "False" (only
    JSON ``false`` was a boolean) and built the opposite model."""
    items = ["a=True", "b=False", "c=None", "d= False ", "e=false", "f=null", 'g="False"',
             "h=FALSE", "i=Falsey"]
    assert parse_config_items(items) == {"a": True, "b": False, "c": None, "d": False,
                                         "e": False, "f": None, "g": "False", "h": "FALSE",
                                         "i": "Falsey"}
