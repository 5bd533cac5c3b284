"""Format versions: each manifest key declares the version it came with (``json_field(since=
...)``); a manifest is written at the lowest version that holds every key it uses, and a
reader refuses a key its document's version does not define (docs/artifacts.md, "Versions").
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from qkan_pack import FORMAT_VERSION, IncompatibleArtifactError, ManifestError
from qkan_pack.format import (
    CHANNELS_LAST,
    CONTIGUOUS,
    LAYOUTS,
    LayoutFigures,
    Manifest,
    OutputClass,
    TensorSpec,
    _schema,
    dumps_manifest,
    manifest_to_dict,
    parse_manifest,
)
from qkan_pack.format._schema import (
    WHEN_DEFAULT,
    ListOf,
    MapOf,
    Nested,
    Nullable,
    Pair,
    Text,
    json_field,
    versioned_keys,
    write_object,
)

from .test_manifest import encode, rich_manifest

GOLDEN = Path(__file__).parents[1] / "golden"


def layout_free_manifest() -> Manifest:
    """``rich_manifest`` without a layout key: reduced precision with a device's per-shape
    choice, padding, a row proof, metadata; every graph contiguous."""
    manifest = rich_manifest()
    policy = manifest.precision
    assert policy is not None
    choice = dataclasses.replace(policy.choices[0], shape_layouts=(), channels_last=None)
    return dataclasses.replace(manifest, precision=dataclasses.replace(
        policy, layouts=(CONTIGUOUS,), choices=(choice,)))


def layout_free_dict() -> dict[str, Any]:
    return manifest_to_dict(layout_free_manifest())


def _with_layouts(manifest: Manifest, **choice: Any) -> Manifest:
    """``manifest`` with both layouts listed, its choice changed by ``choice``."""
    policy = manifest.precision
    assert policy is not None
    changed = dataclasses.replace(policy.choices[0], **choice)
    return dataclasses.replace(manifest, precision=dataclasses.replace(
        policy, layouts=LAYOUTS, choices=(changed,)))


FIGURES = LayoutFigures(latency_us={"bf16": (1.5, 1.0)}, error={"bf16": (0.001, 0.002)})

#: Each key format 3 added, a value of it, and its JSON path.
LAYOUT_KEYS = [pytest.param(path, value, where, id=path[-1]) for path, value, where in (
    (("precision", "layouts"), list(LAYOUTS), "manifest.precision.layouts"),
    (("precision", "choices", 0, "layout"), CHANNELS_LAST,
     "manifest.precision.choices[0].layout"),
    (("precision", "choices", 0, "shape_layouts"), [CONTIGUOUS, CHANNELS_LAST],
     "manifest.precision.choices[0].shape_layouts"),
    (("precision", "choices", 0, "channels_last"), write_object(FIGURES),
     "manifest.precision.choices[0].channels_last"),
)]


def _holding(version: int, path: tuple[Any, ...], value: Any) -> bytes:
    """The layout-free manifest saying ``format_version`` ``version``, with one key set."""
    raw = layout_free_dict()
    raw["format_version"] = version
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return encode(raw)


def test_a_manifest_without_layout_keys_is_written_as_format_2_byte_for_byte() -> None:
    """tests/golden/v2_manifest.json was written by the format-2 writer: the same manifest
    is written to the same bytes, so older readers keep loading it and digests stay."""
    data = dumps_manifest(layout_free_manifest())
    assert data == (GOLDEN / "v2_manifest.json").read_bytes()
    parsed = parse_manifest(data)
    assert parsed.format_version == 2 and dumps_manifest(parsed) == data


@pytest.mark.parametrize("choice", [
    {}, {"layout": CHANNELS_LAST}, {"shape_layouts": (CONTIGUOUS, CHANNELS_LAST)},
    {"channels_last": FIGURES}], ids=["layouts", "layout", "shape_layouts", "channels_last"])
def test_a_manifest_with_a_layout_key_is_written_as_format_3_and_read_back(
        choice: dict[str, Any]) -> None:
    manifest = _with_layouts(layout_free_manifest(), **choice)
    data = dumps_manifest(manifest)
    assert json.loads(data)["format_version"] == 3 == FORMAT_VERSION
    parsed = parse_manifest(data)
    assert parsed.format_version == 3 and parsed == manifest
    assert dumps_manifest(parsed) == data


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(("path", "value", "where"), LAYOUT_KEYS)
def test_an_older_manifest_holding_a_layout_key_is_refused_naming_the_key_and_version(
        version: int, path: tuple[Any, ...], value: Any, where: str) -> None:
    """A released reader of format 2 would refuse the key as unknown: a manifest holding it
    must say format 3 (then older readers say "upgrade qkan-pack")."""
    with pytest.raises(ManifestError) as info:
        parse_manifest(_holding(version, path, value))
    assert not isinstance(info.value, IncompatibleArtifactError)
    assert info.value.where == where
    assert info.value.problem.startswith(f"is not a key format {version} defines: it came "
                                         "with format 3")


@pytest.mark.parametrize(("path", "value", "where"), LAYOUT_KEYS)
def test_a_format_3_manifest_reads_each_layout_key(path: tuple[Any, ...], value: Any,
                                                   where: str) -> None:
    raw = json.loads(_holding(3, path, value))
    raw["precision"]["layouts"] = list(LAYOUTS)  # what a choice's layout must be listed in
    assert parse_manifest(encode(raw)).format_version == 3


def test_a_format_3_manifest_that_uses_no_format_3_key_is_written_back_as_format_2() -> None:
    """Another producer may write format 3 without a layout key: it reads, and is written at
    the lowest version that holds its keys."""
    raw = layout_free_dict()
    raw["format_version"] = 3
    parsed = parse_manifest(encode(raw))
    assert parsed.format_version == 3
    assert dumps_manifest(parsed) == (GOLDEN / "v2_manifest.json").read_bytes()


def test_a_format_4_manifest_is_refused_by_its_version_before_its_keys() -> None:
    raw = manifest_to_dict(rich_manifest())
    raw["format_version"] = 4
    raw["precision"]["choices"][0]["future"] = {"x": 1}
    with pytest.raises(IncompatibleArtifactError, match="upgrade qkan-pack") as info:
        parse_manifest(encode(raw))
    assert info.value.where == "manifest.format_version"
    assert "is 4, newer than this qkan-pack reads (up to 3)" in str(info.value)


def test_format_1_is_written_back_as_format_2() -> None:
    """Format 1 had no ``call`` (its inputs went positionally): written back, the manifest
    spells it out, and the lowest version that holds it is 2. Nothing else changes."""
    data = (GOLDEN / "v1_multi_io" / "manifest.json").read_bytes()
    manifest = parse_manifest(data)
    again = parse_manifest(dumps_manifest(manifest))
    assert (manifest.format_version, again.format_version) == (1, 2)
    assert again == manifest and again.call == "positional" and again.created == manifest.created


# ---------------------------------------------------------------------------
# The schema's ``since``: found wherever a declared field is reached
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Leaf:
    old: str = json_field(Text())
    new: str = json_field(Text(), default="", omit=WHEN_DEFAULT, since=7)


@dataclass(frozen=True)
class _Tree:
    one: _Leaf = json_field(Nested(_Leaf))
    many: tuple[_Leaf, ...] = json_field(ListOf(Nested(_Leaf)), default=())
    named: dict[str, _Leaf] = json_field(MapOf(Nested(_Leaf)), factory=dict)
    maybe: _Leaf | None = json_field(Nullable(Nested(_Leaf)), default=None)
    pair: tuple[_Leaf, str] | None = json_field(Nullable(Pair(Nested(_Leaf), Text())),
                                                default=None)
    later: str = json_field(Text(), default="", omit=WHEN_DEFAULT, since=5)


def test_since_is_found_in_every_container_and_only_where_the_key_is_written() -> None:
    old, new = _Leaf("a"), _Leaf("a", "b")
    assert list(versioned_keys(_Tree, write_object(_Tree(old, (old,), {"k": old}, old,
                                                         (old, "t"))), "x")) == []
    tree = _Tree(new, (old, new), {"k": new}, new, (new, "t"), later="c")
    assert list(versioned_keys(_Tree, write_object(tree), "x")) == [
        ("x.one.new", 7), ("x.many[1].new", 7), ("x.named.k.new", 7), ("x.maybe.new", 7),
        ("x.pair[0].new", 7), ("x.later", 5)]
    # malformed parts are passed over, for the reader to refuse
    assert list(versioned_keys(_Tree, {"one": [], "many": {}, "named": [1], "maybe": 3,
                                       "pair": [{"new": "b"}]}, "x")) == []


def test_since_is_found_anywhere_in_an_output_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The output tree is read by its own codec: its tensor specs and classes are walked too,
    at any depth (were a key added to them)."""
    for cls, field in ((TensorSpec, "dtype"), (OutputClass, "form")):
        monkeypatch.setitem(_schema._LAYOUTS, cls, tuple(
            _copy_slot(slot, since=9 if slot.field == field else None)
            for slot in _schema._layout(cls)))
    raw = manifest_to_dict(rich_manifest())
    found = [where for where, since in versioned_keys(Manifest, raw, "manifest") if since == 9]
    outputs = "manifest.shapes[0].outputs"
    assert f"{outputs}.dict.y.tensor.dtype" in found
    assert f"{outputs}.dict.parts.tuple[1].list[0].tensor.dtype" in found
    assert f"{outputs}.class.form" in found
    assert len(found) == 2 * 4  # two shapes, three tensors and a class each


def _copy_slot(slot: Any, since: int | None) -> Any:
    copy = object.__new__(type(slot))
    for name in type(slot).__slots__:
        object.__setattr__(copy, name, getattr(slot, name))
    copy.since = since
    return copy
