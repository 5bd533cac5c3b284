"""Model metadata (name, version, description, license, labels, class labels) and the
input/output schema: recorded at build, digested, parsed strictly, shown by inspect."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from qkan_pack import ManifestError, ShapeSpecError, build
from qkan_pack.cli import cli
from qkan_pack.format import (
    Metadata,
    check_metadata,
    dumps_manifest,
    manifest_schema,
    parse_manifest,
)
from qkan_pack.runtime import read_artifact

from ..conftest import MODELS


def test_metadata_round_trips_and_is_digested(tmp_path: Path) -> None:
    plain = build(MODELS / "plain_mlp.py", "2x2,8x2", output=tmp_path / "a", progress=False)
    assert plain.manifest.metadata == Metadata(name="plain_mlp", version="1")
    described = build(MODELS / "plain_mlp.py", "2x2,8x2", output=tmp_path / "b",
                      name="tiny-mlp", model_version="2.0.1", description="A tiny MLP",
                      license="MIT", labels={"team": "search", "tier/x": "gold"}, progress=False)
    assert described.digest != plain.digest
    metadata = read_artifact(described.path).manifest.metadata
    assert metadata == Metadata(name="tiny-mlp", version="2.0.1", description="A tiny MLP",
                                license="MIT", labels={"team": "search", "tier/x": "gold"})
    assert parse_manifest(dumps_manifest(described.manifest)).metadata == metadata


@pytest.mark.parametrize(("given", "problem"), [
    ({"name": "my model"}, "name 'my model'"),
    ({"version": ""}, "version ''"),
    ({"labels": {"bad key": "x"}}, "label key 'bad key'"),
    ({"description": "x" * 2000}, "at most 1024"),
    ({"license": "MIT\x1b[2J"}, "control characters"),
])
def test_bad_metadata_is_a_usage_error_at_build(given: dict, problem: str) -> None:
    fields = {"name": "m", "version": "1", **given}
    with pytest.raises(ShapeSpecError, match=problem):
        check_metadata(**fields)


def test_a_manifest_with_bad_metadata_is_refused(tmp_path: Path) -> None:
    result = build(MODELS / "plain_mlp.py", "2x2", output=tmp_path / "a", progress=False)
    raw = json.loads(dumps_manifest(result.manifest))
    for bad in ({"name": 3}, {"labels": []}, {"labels": {"k": 1}}, {"surprise": "x"},
                {"class_labels": ["a", 2]}):
        raw["metadata"] = {**raw["metadata"], **bad}
        with pytest.raises(ManifestError):
            parse_manifest(json.dumps(raw))
        raw = json.loads(dumps_manifest(result.manifest))
    del raw["metadata"]  # artifacts built before metadata existed read as the defaults
    assert parse_manifest(json.dumps(raw)).metadata == Metadata()


def test_a_transformers_classifiers_id2label_becomes_its_class_labels(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    source = tmp_path / "labelled.py"
    source.write_text(
        "import torch\nfrom transformers import BertConfig, BertForSequenceClassification\n\n"
        "def build_model(named=True):\n    torch.manual_seed(0)\n"
        "    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,\n"
        "                        num_attention_heads=2, intermediate_size=16, num_labels=3,\n"
        "                        max_position_embeddings=32)\n"
        "    if named:\n"
        "        config.id2label = {0: 'negative', 1: 'neutral', 2: 'positive'}\n"
        "    return BertForSequenceClassification(config)\n")
    shapes = [{"input_ids": (1, 8), "attention_mask": (1, 8)}]
    result = build(source, shapes, dtype="int64", output=tmp_path / "a", progress=False)
    assert result.manifest.metadata.class_labels == ("negative", "neutral", "positive")
    placeholder = build(source, shapes, dtype="int64", output=tmp_path / "b",
                        config={"named": False}, progress=False)
    assert placeholder.manifest.metadata.class_labels == ()  # LABEL_0.. say nothing


@pytest.mark.parametrize(("kind", "says"), [
    ("control", "class label 1 holds control characters"),
    ("long", "class label 1 is 2000 characters; at most 1024"),
    ("many", "100001 class labels; at most 100000"),
    ("surrogate", "class label 1 is not UTF-8 text: character 4 is \\\\udce9"),
    ("huge", "its 100000 class labels take 6400000 bytes, more than the 4194304 bytes"),
    ("large", "the manifest would be .* bytes, more than the 4194304 bytes every reader "
              "accepts .*largest parts: metadata"),
])
def test_class_labels_a_reader_refuses_leave_the_previous_artifact_alone(
        tmp_path: Path, kind: str, says: str) -> None:
    """A model's config.id2label skipped the metadata checks: control characters, labels
    over 1,024 characters, 100,001 labels or a manifest over 4 MiB built with exit 0 and,
    with --force, replaced a good artifact with one inspect and verify refuse. Now checked
    as the other metadata (labels alone over the limit before the model runs), and the
    manifest's size before anything is installed."""
    good = build(MODELS / "labelled.py", "1x2", output=tmp_path / "art", progress=False)
    assert good.manifest.metadata.class_labels == ("cat", "dog", "bird")
    with pytest.raises(ManifestError, match=says):
        build(MODELS / "labelled.py", "1x2", output=tmp_path / "art", config={"kind": kind},
              force=True, progress=False)
    assert read_artifact(good.path).digest == good.digest  # intact, and still verifies
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]  # no leftovers beside it
    result = CliRunner().invoke(cli, ["verify", str(good.path)])
    assert result.exit_code == 0, result.output


def test_the_cli_build_refuses_what_it_could_not_read_back(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["build", str(MODELS / "labelled.py"), "--shapes", "1x2",
                                      "-o", str(tmp_path / "art"), "--config", "kind=control"])
    assert result.exit_code == 1, result.output
    assert "config.id2label: class label 1 holds control characters" in result.output
    assert "digest" not in result.output and not (tmp_path / "art").exists()


@pytest.mark.parametrize(("kind", "outputs", "labels"), [("good", 10, 3), ("thousand", 10, 1000)])
def test_class_labels_no_output_has_room_for_are_refused_at_build(
        tmp_path: Path, kind: str, outputs: int, labels: int) -> None:
    """A model of 10 outputs whose config.id2label held 1000 (or 3) labels built, and
    predict named no class (or named the wrong ones): the count is held to the outputs'."""
    says = (f"config.id2label has {labels} class labels, but no output has {labels} values "
            f"along its last dimension at every declared shape (at 1x2: output 1x{outputs})")
    with pytest.raises(ManifestError, match=re.escape(says)):
        build(MODELS / "labelled.py", "1x2", output=tmp_path / "a",
              config={"kind": kind, "outputs": outputs}, progress=False)
    result = CliRunner().invoke(cli, ["build", str(MODELS / "labelled.py"), "--shapes", "1x2",
                                      "-o", str(tmp_path / "a"), "--config", f"kind={kind}",
                                      "--config", f"outputs={outputs}"])
    assert result.exit_code == 1 and says in result.output, result.output
    assert not (tmp_path / "a").exists()


SEVERAL_OUTPUTS = """
from types import SimpleNamespace

import torch


class Tagged(torch.nn.Module):
    def __init__(self, labels):
        super().__init__()
        torch.manual_seed(0)
        self.classes = torch.nn.Linear(2, 3)
        self.hidden = torch.nn.Linear(2, 5)
        self.config = SimpleNamespace(id2label=dict(enumerate(labels)))

    def forward(self, x):
        return {"hidden": self.hidden(x), "logits": self.classes(x)}


def build_model(labels=("cat", "dog", "bird")):
    return Tagged(list(labels))
"""


def test_labels_fit_one_output_of_several(tmp_path: Path) -> None:
    """Of several outputs, one whose last dimension is the number of labels takes them (a
    ModelOutput's ``logits`` beside its hidden states); labels that fit none are refused,
    naming each output's shape."""
    source = tmp_path / "tagged.py"
    source.write_text(SEVERAL_OUTPUTS)
    built = build(source, "1x2,4x2", output=tmp_path / "a", progress=False)
    assert built.manifest.metadata.class_labels == ("cat", "dog", "bird")
    says = ("has 4 class labels, but no output has 4 values along its last dimension at every "
            "declared shape (at 1x2: output.hidden 1x5, output.logits 1x3)")
    with pytest.raises(ManifestError, match=re.escape(says)):
        build(source, "1x2,4x2", output=tmp_path / "b", config={"labels": list("abcd")},
              progress=False)


@pytest.mark.parametrize("field", ["description", "license", "name", "labels"])
def test_text_that_is_not_utf8_is_refused_at_build(tmp_path: Path, field: str) -> None:
    """A lone surrogate (what Python makes of a byte that is not UTF-8 in an argument) in
    --description was accepted and broke serve's GET /."""
    value: object = "caf\udce9"
    if field == "labels":
        value = {"team": "caf\udce9"}
    with pytest.raises(ShapeSpecError, match=r"not UTF-8 text: character 4 is .*lone surrogate"):
        build(MODELS / "plain_mlp.py", "2x2", output=tmp_path / "a", progress=False,
              **{field: value})
    assert not (tmp_path / "a").exists()
    result = CliRunner().invoke(cli, ["build", str(MODELS / "plain_mlp.py"), "--shapes", "2x2",
                                      "-o", str(tmp_path / "a"), "--description", "caf\udce9"])
    assert result.exit_code == 2 and "lone surrogate" in result.output, result.output


@pytest.mark.parametrize("escaped", ["\\ud800", "\\udce9", "caf\\udce9"])
def test_a_manifest_holding_a_lone_surrogate_is_refused(tmp_path: Path, escaped: str) -> None:
    """JSON escapes that decode to no UTF-8 text are refused by the reader anywhere in a
    manifest (metadata, config, a key), as orjson and every strict reader refuse them."""
    result = build(MODELS / "plain_mlp.py", "2x2", output=tmp_path / "a", progress=False)
    data = dumps_manifest(result.manifest).decode()
    for edited in (data.replace('"description": ""', f'"description": "{escaped}"'),
                   data.replace('"config": {}', f'"config": {{"k": "{escaped}"}}'),
                   data.replace('"labels": {}', f'"labels": {{"{escaped}": "x"}}')):
        assert edited != data
        with pytest.raises(ManifestError, match="lone surrogate"):
            parse_manifest(edited)
    raw = data.encode().replace(b'"description": ""', b'"description": "caf\xed\xb3\xa9"')
    with pytest.raises(ManifestError, match="lone surrogate"):  # the bytes, not an escape
        parse_manifest(raw)


def test_the_schema_lists_inputs_outputs_and_entries(tmp_path: Path) -> None:
    result = build(MODELS / "multi_io.py", [{"a": (1, 3), "b": (1, 2)}, {"a": (8, 3), "b": (8, 2)}],
                   dtype={"a": "float32", "b": "int64"}, output=tmp_path / "a", progress=False)
    schema = manifest_schema(result.manifest)
    assert [(i["name"], i["dtype"], i["shapes"]) for i in schema["inputs"]] == [
        ("a", "float32", [[1, 3], [8, 3]]), ("b", "int64", [[1, 2], [8, 2]])]
    assert schema["inputs"][1]["range"] == [0, 8]  # from the embedding it indexes
    assert schema["call"] == "keyword" and len(schema["entries"]) == 2
    assert all(len(o["shapes"]) == 2 for o in schema["outputs"])


def test_inspect_shows_metadata_and_its_json_carries_the_schema(tmp_path: Path) -> None:
    path = build(MODELS / "plain_mlp.py", "2x2", output=tmp_path / "a", license="MIT",
                 labels={"team": "search"}, progress=False).path
    shown = CliRunner().invoke(cli, ["inspect", str(path)])
    assert shown.exit_code == 0
    assert "name       plain_mlp version 1, license MIT" in shown.output
    assert "labels     team=search" in shown.output
    data = json.loads(CliRunner().invoke(cli, ["inspect", str(path), "--json"]).output)
    assert data["schema"]["inputs"][0]["shapes"] == [[2, 2]]
    assert data["manifest"]["metadata"]["labels"] == {"team": "search"}


@pytest.mark.parametrize("keys", ["mixed", "negative"])
def test_an_id2label_keyed_otherwise_than_by_index_is_named_not_dropped_silently(
        tmp_path: Path, keys: str) -> None:
    """Seventh pass L3: labels keyed otherwise than 0..N-1 were dropped at exit 0 without a
    word; the build says why the artifact has no class labels."""
    with pytest.warns(UserWarning, match="not the class indices 0..2"):
        result = build(MODELS / "labelled.py", "1x2", output=tmp_path / "a", progress=False,
                       entry="build_keyed", config={"keys": keys})
    assert result.manifest.metadata.class_labels == ()
