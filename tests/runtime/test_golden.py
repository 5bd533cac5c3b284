"""Artifacts written by older qkan-pack versions keep loading: golden artifacts of each format
version (tests/golden/), read by the runtime of today and compared with eager PyTorch."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from qkan_pack import Predictor, read_artifact
from qkan_pack.format import dumps_manifest

from ..conftest import MODELS, ROOT

GOLDEN = ROOT / "tests" / "golden"


def _eager(model_file: str) -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location(f"golden_{model_file}", MODELS / model_file)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module.build_model().eval()


def test_format_1_single_input() -> None:
    artifact = read_artifact(GOLDEN / "v1_plain_mlp")
    assert artifact.manifest.format_version == 1 and artifact.manifest.call == "positional"
    assert artifact.manifest.created  # format 1 carried a build time
    eager = _eager("plain_mlp.py")
    with Predictor.load(GOLDEN / "v1_plain_mlp") as predictor:
        for batch in (1, 4):
            x = torch.randn(batch, 2)
            with torch.no_grad():
                torch.testing.assert_close(predictor(x), eager(x))


def test_format_1_two_inputs_positionally() -> None:
    """Format 1 passed named inputs positionally, in declared order: so it still does."""
    eager = _eager("multi_io.py")
    with Predictor.load(GOLDEN / "v1_multi_io") as predictor:
        assert predictor.manifest.call == "positional"
        a, b = torch.randn(2, 3), torch.randint(0, 8, (2, 4))
        with torch.no_grad():
            want = eager(a, b)
        got = predictor(a=a, b=b)
        torch.testing.assert_close(got["y"], want["y"])
        torch.testing.assert_close(got["parts"][1][1], want["parts"][1][1])


def test_format_2_with_a_precision_choice() -> None:
    """Built with ``--precision auto`` and warmed on a CPU by the format-2 writer: it loads
    in float32 (the choice it recorded, or the default on another CPU) and is written back
    to the same bytes (a manifest without a format-3 key stays format 2)."""
    artifact = read_artifact(GOLDEN / "v2_plain_mlp_auto")
    manifest = artifact.manifest
    assert manifest.format_version == 2 and manifest.precision is not None
    assert manifest.precision.choices and manifest.precision.layouts == ("contiguous",)
    assert dumps_manifest(manifest) == artifact.manifest_bytes
    eager = _eager("plain_mlp.py")
    with Predictor.load(GOLDEN / "v2_plain_mlp_auto", device="cpu") as predictor:
        assert predictor.report.precision.precision == "fp32"
        x = torch.randn(4, 2)
        with torch.no_grad():
            torch.testing.assert_close(predictor(x), eager(x))


@pytest.mark.parametrize("name", ["v1_plain_mlp", "v1_multi_io", "v2_plain_mlp_auto"])
def test_golden_artifacts_are_untouched(name: str) -> None:
    """The files on disk are the ones the old writer produced (digests still match)."""
    assert read_artifact(GOLDEN / name).digest.startswith("sha256:")
