"""The manifest's reduced-precision fields: optional (an artifact without them is float32, as
every artifact built before them), round-tripped exactly, and every malformed one refused by
name (a re-hashed manifest must not reach the runtime with a precision it cannot check)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from qkan_pack import ManifestError
from qkan_pack.format import (
    LAYOUTS,
    MAX_MAX_ERROR,
    PRECISIONS,
    LayoutFigures,
    PrecisionChoice,
    PrecisionPolicy,
    dumps_manifest,
    geometric_mean,
    manifest_to_dict,
    parse_manifest,
    precision_choice_to_dict,
)

from .test_manifest import encode, sample_manifest

CHOICE = PrecisionChoice(key="sm90-NVIDIA_H100_80GB_HBM3", precision="bf16",
                         details={"gpu": "NVIDIA H100 80GB HBM3", "arch": "sm_90"},
                         latency_us={"fp32": (40.0, 90.0), "bf16": (30.0, 45.0)},
                         error={"bf16": (0.004, 0.0051)}, refused={"fp16": "overflow"})


def precise_manifest() -> Any:
    manifest = sample_manifest()
    shapes = (dataclasses.replace(manifest.shapes[0], precision_error={"bf16": 0.004,
                                                                       "tf32": None}),
              manifest.shapes[1])
    policy = PrecisionPolicy(default="fp32", max_error=1e-2, allowed=("fp32", "tf32", "bf16"),
                             choices=(CHOICE,))
    return dataclasses.replace(manifest, shapes=shapes, precision=policy)


def test_precision_fields_round_trip_exactly() -> None:
    manifest = precise_manifest()
    data = dumps_manifest(manifest)
    parsed = parse_manifest(data)
    assert parsed == manifest and dumps_manifest(parsed) == data
    assert parsed.precision is not None
    assert parsed.precision.choice(CHOICE.key) == CHOICE
    assert parsed.precision.choice("sm80-other") is None
    assert parsed.shapes[0].precision_error == {"bf16": 0.004, "tf32": None}
    assert CHOICE.mean_latency_us("bf16") == pytest.approx(geometric_mean([30.0, 45.0]))
    assert manifest_to_dict(parsed)["precision"]["choices"][0] == precision_choice_to_dict(CHOICE)


def test_a_float32_artifact_carries_no_precision_fields() -> None:
    """Float32 builds write what they wrote before (same bytes, same digests), and such a
    manifest reads as float32."""
    data = dumps_manifest(sample_manifest())
    assert b"precision_error" not in data and b'"precision":' not in data
    parsed = parse_manifest(data)
    assert parsed.precision is None and parsed.shapes[0].precision_error == {}


def _mutated(path: tuple[Any, ...], value: Any) -> bytes:
    raw = copy.deepcopy(manifest_to_dict(precise_manifest()))
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return encode(raw)


@pytest.mark.parametrize(("path", "value", "where", "says"), [
    (("precision", "default"), "fp8", "default", 'must be one of fp32, tf32, bf16, fp16, got "fp8"'),
    (("precision", "default"), "fp16", "default", "must be among the allowed"),
    (("precision", "allowed"), ["bf16"], "allowed", "must list fp32 and each precision once"),
    (("precision", "allowed"), ["fp32", "int8"], "allowed[1]", "must be one of fp32, tf32"),
    (("precision", "allowed"), ["fp32", "bf16", "bf16"], "allowed", "each precision once"),
    (("precision", "max_error"), 0.0, "max_error", r"must be in (0, 0.1], got 0.0"),
    (("precision", "max_error"), MAX_MAX_ERROR * 2, "max_error", "must be in (0, 0.1]"),
    (("precision", "max_error"), -1e-2, "max_error", "must be in (0, 0.1]"),
    (("precision", "max_error"), "0.01", "max_error", "must be a number"),
    (("precision", "max_error"), True, "max_error", "must be a number, got true"),
    (("precision", "choices", 0, "precision"), "fp16", "choices[0].precision",
     "must be one of the allowed precisions fp32, tf32, bf16"),
    (("precision", "choices", 0, "latency_us", "bf16"), [30.0], "choices[0].latency_us.bf16",
     "one per shape"),
    (("precision", "choices", 0, "latency_us", "bf16"), [30.0, -1.0],
     "choices[0].latency_us.bf16[1]", "must be a non-negative number"),
    (("precision", "choices", 0, "error", "fp16"), [0.1, 0.1], "choices[0].error.fp16",
     "of an allowed precision"),
    (("precision", "choices", 0, "error", "int8"), [0.1, 0.1], "choices[0].error.int8",
     "is not a valid key here: keys must be one of fp32"),
    (("precision", "choices", 0, "refused"), {"bf16": 3}, "choices[0].refused.bf16",
     "must be text"),
    (("precision", "choices", 0, "key"), 7, "choices[0].key", "must be text"),
    (("precision", "choices", 0, "shapes"), ["bf16"], "choices[0].shapes",
     "one allowed precision per shape (2)"),
    (("precision",), [], "", "must be a JSON object"),
])
def test_malformed_precision_fields_are_refused_by_name(path: tuple[Any, ...], value: Any,
                                                        where: str, says: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest(_mutated(path, value))
    assert info.value.where == f"manifest.precision.{where}".rstrip(".")
    assert says in info.value.problem


@pytest.mark.parametrize(("value", "where", "says"), [
    ({"bf16": -0.1}, ".bf16", "must be a non-negative number or null"),
    ({"bf16": "0.1"}, ".bf16", "must be a non-negative number or null"),
    ({"fp64": 0.1}, ".fp64", "is not a valid key here: keys must be one of fp32"),
    ([0.1], "", "must be a JSON object"),
])
def test_malformed_shape_precision_errors_are_refused_by_name(value: Any, where: str,
                                                              says: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest(_mutated(("shapes", 0, "precision_error"), value))
    assert info.value.where == "manifest.shapes[0].precision_error" + where
    assert says in info.value.problem


def test_one_choice_per_device_key() -> None:
    raw = manifest_to_dict(precise_manifest())
    raw["precision"]["choices"].append(copy.deepcopy(raw["precision"]["choices"][0]))
    with pytest.raises(ManifestError, match="repeats the device key of manifest.precision."
                                            r"choices\[0\]") as info:
        parse_manifest(encode(raw))
    assert info.value.where == "manifest.precision.choices[1]"


def test_a_writer_cannot_make_an_invalid_policy_either() -> None:
    """The dataclass checks itself: a hand-re-signed manifest is refused before it is written."""
    with pytest.raises(ManifestError, match="max_error"):
        PrecisionPolicy(default="bf16", max_error=float("nan"), allowed=("fp32", "bf16"))
    with pytest.raises(ManifestError, match="allowed"):
        PrecisionPolicy(default="bf16", max_error=1e-2, allowed=("bf16",))
    assert set(PRECISIONS) == {"fp32", "tf32", "bf16", "fp16"}


# ---------------------------------------------------------------------------
# Layouts: the channels-last graphs a choice may keep (issue 44, item 2)
# ---------------------------------------------------------------------------

CL_CHOICE = dataclasses.replace(
    CHOICE, precision="bf16", layout="channels_last", shape_layouts=("contiguous",
                                                                     "channels_last"),
    channels_last=LayoutFigures(latency_us={"fp32": (41.0, 80.0), "bf16": (31.0, 30.0)},
                                error={"fp32": (0.0, 0.0), "bf16": (0.004, 0.005)},
                                refused={"tf32": "beyond max_error"}))


def layout_manifest(choice: PrecisionChoice = CL_CHOICE) -> Any:
    manifest = precise_manifest()
    policy = dataclasses.replace(manifest.precision, layouts=LAYOUTS, choices=(choice,))
    return dataclasses.replace(manifest, precision=policy)


def test_a_layout_choice_round_trips_and_reads_back_per_shape() -> None:
    manifest = layout_manifest()
    data = dumps_manifest(manifest)
    parsed = parse_manifest(data)
    assert parsed == manifest and dumps_manifest(parsed) == data
    raw = manifest_to_dict(parsed)["precision"]
    assert raw["layouts"] == ["contiguous", "channels_last"]
    assert list(raw) == ["default", "max_error", "allowed", "layouts", "choices"]
    choice = parsed.precision.choice(CHOICE.key)
    assert (choice.layout, choice.layout_for_shape(0), choice.layout_for_shape(1)) == (
        "channels_last", "contiguous", "channels_last")
    assert choice.per_shape and choice.for_shape(1) == "bf16"
    assert choice.mean_latency_us("bf16", "channels_last") == pytest.approx(
        geometric_mean([31.0, 30.0]))
    assert choice.figures()["fp32", "contiguous"] == ((40.0, 90.0), None)
    assert choice.figures()["bf16", "channels_last"] == ((31.0, 30.0), (0.004, 0.005))


def test_layouts_are_written_only_where_they_say_something() -> None:
    """An artifact without channels-last graphs (every model without a 2-D convolution, and
    every artifact built before layouts) writes and reads as before: no new key, the
    contiguous layout everywhere."""
    data = dumps_manifest(precise_manifest())
    for key in (b'"layouts"', b'"layout"', b'"shape_layouts"', b'"channels_last"'):
        assert key not in data
    parsed = parse_manifest(data)
    assert parsed.precision.layouts == ("contiguous",)
    choice = parsed.precision.choice(CHOICE.key)
    assert (choice.layout, choice.shape_layouts, choice.channels_last) == ("contiguous", (),
                                                                           None)
    assert not choice.per_shape and choice.layout_for_shape(1) == "contiguous"


def _layout_mutated(path: tuple[Any, ...], value: Any) -> bytes:
    raw = copy.deepcopy(manifest_to_dict(layout_manifest()))
    node = raw
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return encode(raw)


DELETE = object()


@pytest.mark.parametrize(("path", "value", "where", "says"), [
    (("precision", "layouts"), ["contiguous", "nhwc"], "layouts[1]",
     'must be one of contiguous, channels_last, got "nhwc"'),
    (("precision", "layouts"), ["channels_last"], "layouts",
     "must list contiguous first and each layout once"),
    (("precision", "layouts"), ["contiguous", "channels_last", "channels_last"], "layouts",
     "each layout once"),
    (("precision", "layouts"), "channels_last", "layouts", "must be a JSON list"),
    (("precision", "choices", 0, "layout"), "channels_first", "choices[0].layout",
     "must be one of contiguous, channels_last"),
    (("precision", "choices", 0, "shape_layouts"), ["channels_last"],
     "choices[0].shape_layouts", "one layout per shape (2)"),
    (("precision", "choices", 0, "shape_layouts", 1), 3, "choices[0].shape_layouts[1]",
     "must be one of contiguous, channels_last, got 3"),
    (("precision", "choices", 0, "channels_last", "latency_us", "bf16"), [1.0],
     "choices[0].channels_last.latency_us.bf16", "one per shape"),
    (("precision", "choices", 0, "channels_last", "error", "fp16"), [0.1, 0.1],
     "choices[0].channels_last.error.fp16", "of an allowed precision"),
    (("precision", "choices", 0, "channels_last", "refused"), {"bf16": None},
     "choices[0].channels_last.refused.bf16", "must be text"),
    (("precision", "choices", 0, "channels_last"), [], "choices[0].channels_last",
     "must be a JSON object"),
    # a choice of channels-last graphs in an artifact whose build did not list them
    (("precision", "layouts"), DELETE, "choices[0].channels_last",
     "names the layout channels_last that manifest.precision.layouts does not list"),
])
def test_malformed_layouts_are_refused_by_name(path: tuple[Any, ...], value: Any, where: str,
                                               says: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest(_layout_mutated(path, value))
    assert info.value.where == f"manifest.precision.{where}"
    assert says in info.value.problem


def test_a_layout_choice_without_its_figures_still_names_listed_layouts() -> None:
    """The choice's own layout (and each shape's) is checked against the build's list even
    where no channels-last figures came with it."""
    bare = dataclasses.replace(CL_CHOICE, channels_last=None)
    raw = manifest_to_dict(layout_manifest(bare))
    del raw["precision"]["layouts"]
    with pytest.raises(ManifestError) as info:
        parse_manifest(encode(raw))
    assert info.value.where == "manifest.precision.choices[0].layout"
    raw["precision"]["choices"][0]["layout"] = "contiguous"
    with pytest.raises(ManifestError, match="one layout per shape") as info:
        parse_manifest(encode(raw))
    assert info.value.where == "manifest.precision.choices[0].shape_layouts"
