"""Reproducible builds: the same model file content, weights, shapes and options give the
same artifact digest, whatever the directory, the time or the process."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from qkan_pack import build

from ..conftest import EXAMPLES, MODELS, ROOT

BUILD = ("import sys; from qkan_pack import build; "
         "print(build(sys.argv[1], '1x2,8x2', output=sys.argv[2]).digest)")


def test_same_inputs_same_digest_in_other_directories(tmp_path: Path) -> None:
    """The model file copied elsewhere, built a second later into another folder."""
    copy = tmp_path / "elsewhere" / "qkan_mlp.py"
    copy.parent.mkdir()
    shutil.copy(EXAMPLES / "qkan_mlp.py", copy)
    first = build(EXAMPLES / "qkan_mlp.py", "1x2,8x2", output=tmp_path / "a" / "one")
    time.sleep(1.1)  # a timestamp in the manifest would now differ
    second = build(copy, "1x2,8x2", output=tmp_path / "b" / "two")
    assert first.digest == second.digest
    assert (first.path / "manifest.json").read_bytes() == (second.path / "manifest.json").read_bytes()


def test_same_digest_from_a_fresh_process(tmp_path: Path) -> None:
    here = build(MODELS / "plain_mlp.py", "1x2,8x2", output=tmp_path / "here").digest
    done = subprocess.run([sys.executable, "-c", BUILD, str(MODELS / "plain_mlp.py"),
                           str(tmp_path / "there")], capture_output=True, text=True, check=True,
                          cwd=ROOT)
    assert done.stdout.strip().splitlines()[-1] == here


def test_different_options_give_different_digests(tmp_path: Path) -> None:
    base = build(MODELS / "plain_mlp.py", "1x2", output=tmp_path / "base").digest
    assert build(MODELS / "plain_mlp.py", "1x2", output=tmp_path / "seed", seed=1).digest != base
    assert build(MODELS / "plain_mlp.py", "1x2", output=tmp_path / "cfg",
                 config={"hidden": 9}).digest != base
