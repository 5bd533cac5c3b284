"""What ``GET /`` describes: the model's metadata and schema, and no empty fields."""

from __future__ import annotations

from pathlib import Path

from qkan_pack import build
from qkan_pack.serve import describe_artifact, row_plan

from ..conftest import MODELS


def test_get_root_shows_metadata_and_schema_without_an_empty_created(tmp_path: Path) -> None:
    result = build(MODELS / "plain_mlp.py", "1x2,8x2", output=tmp_path / "a", license="MIT",
                   labels={"team": "search"}, progress=False)
    shown = describe_artifact(result.manifest, result.digest, row_plan(result.manifest))
    assert "created" not in shown  # was "created": "" for every format-2 artifact
    assert shown["metadata"]["name"] == "plain_mlp" and shown["metadata"]["license"] == "MIT"
    assert shown["metadata"]["labels"] == {"team": "search"}
    assert shown["schema"]["inputs"][0]["shapes"] == [[1, 2], [8, 2]]
