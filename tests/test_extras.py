"""A missing optional package is named with the one line that installs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from qkan_pack import ModelSourceError, build
from qkan_pack._extras import install_hint, missing_module
from qkan_pack.cli import cli

from .conftest import MODELS, ROOT


def test_the_one_table() -> None:
    assert install_hint("qkan") == "pip install 'qkan-pack[qkan]'"
    assert install_hint("orjson") == "pip install 'qkan-pack[serve]'"
    assert install_hint("model_signing.hashing") == "pip install 'qkan-pack[sign]'"
    assert install_hint("transformers", {"transformers": "4.57.1"}) == \
        "pip install transformers==4.57.1"
    assert install_hint("PIL") == "pip install pillow"
    try:
        import not_a_module_xyz  # noqa: F401
    except ModuleNotFoundError as exc:
        assert missing_module(RuntimeError("no module involved")) is None
        wrapped = RuntimeError("wrapped")
        wrapped.__cause__ = exc
        assert missing_module(wrapped) == "not_a_module_xyz"


def test_a_model_whose_import_needs_a_missing_package_says_how_to_install_it(
        tmp_path: Path) -> None:
    source = tmp_path / "needs.py"
    source.write_text("import torch\nimport qkan_missing_thing\n\n"
                      "def build_model():\n    return torch.nn.Linear(2, 2)\n")
    with pytest.raises(ModelSourceError, match="install it: pip install qkan_missing_thing"):
        build(source, "1x2", output=tmp_path / "a", progress=False)


def test_a_load_without_the_models_package_names_the_recorded_version(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    shapes = [{"input_ids": (1, 8), "attention_mask": (1, 8)}]
    result = build(MODELS / "hf_models.py", shapes, dtype="int64", config={"arch": "bert"},
                   output=tmp_path / "bert", progress=False)
    version = result.manifest.model.packages["transformers"]
    script = ("import sys; sys.modules['transformers'] = None\n"  # as if not installed
              "from qkan_pack import Predictor\n"
              f"Predictor.load({str(result.path)!r})\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode != 0
    assert f"the model needs transformers: pip install transformers=={version}" in done.stderr


def test_the_cli_names_the_extra_for_a_missing_optional_library(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    path = build(MODELS / "plain_mlp.py", "2x2", output=tmp_path / "a", progress=False).path
    done = CliRunner().invoke(cli, ["bench", str(path), "--iters", "2", "--repeats", "1",
                                    "--warmup", "0", "--plot", str(tmp_path / "p.png")])
    assert done.exit_code == 1
    assert "pip install 'qkan-pack[bench]'" in done.output and "unexpected" not in done.output
