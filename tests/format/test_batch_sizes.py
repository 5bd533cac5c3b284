"""``--batch-sizes``: per-row shapes declared at every batch size."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from qkan_pack import ShapeSpecError, build
from qkan_pack.cli import cli
from qkan_pack.format import parse_batch_sizes, with_batch_sizes

from ..conftest import MODELS


def test_per_row_shapes_times_batch_sizes() -> None:
    assert with_batch_sizes([(128,)], [1, 8, 32]) == [(1, 128), (8, 128), (32, 128)]
    assert with_batch_sizes([(32,), (128,)], [1, 8]) == [(1, 32), (8, 32), (1, 128), (8, 128)]
    named = [{"input_ids": (16,), "attention_mask": (16,)}]
    assert with_batch_sizes(named, [2]) == [{"input_ids": (2, 16), "attention_mask": (2, 16)}]


@pytest.mark.parametrize("text", ["", "0", "1,1", "1,-2", "a", "1.5"])
def test_bad_batch_sizes_are_refused(text: str) -> None:
    with pytest.raises(ShapeSpecError):
        parse_batch_sizes(text)


def test_rank_overflow_is_refused() -> None:
    with pytest.raises(ShapeSpecError, match="more than 8 dimensions"):
        with_batch_sizes([(1,) * 8], [2])


def test_build_and_cli_expand_batch_sizes(tmp_path: Path) -> None:
    result = build(MODELS / "plain_mlp.py", "2", batch_sizes=[1, 8], output=tmp_path / "a",
                   progress=False)
    assert [entry.label for entry in result.manifest.shapes] == ["1x2", "8x2"]
    done = CliRunner().invoke(cli, ["build", str(MODELS / "plain_mlp.py"), "--shapes", "2",
                                    "--batch-sizes", "4,16", "-o", str(tmp_path / "b")])
    assert done.exit_code == 0, done.output
    assert "(4x2, 16x2;" in done.output
    bad = CliRunner().invoke(cli, ["build", str(MODELS / "plain_mlp.py"), "--shapes", "2",
                                   "--batch-sizes", "4,4", "-o", str(tmp_path / "c")])
    assert bad.exit_code == 2 and "repeat a size" in bad.output
