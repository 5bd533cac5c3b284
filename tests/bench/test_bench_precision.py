"""``qkan-pack bench --precision``: the whole model at each precision side by side in one
process (latency, GPU time per call, pool memory, error against the float32 references);
eager on a CPU, where TF32 and float16 are said to be unavailable; for a model with a 2-D
convolution, each precision in both layouts (contiguous and channels-last)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from qkan_pack import BenchError, build
from qkan_pack.bench import BenchSettings, render_table, run_bench
from qkan_pack.cli import cli

from ..conftest import MODELS

FAST = BenchSettings(iters=6, repeats=1, warmup=1, blocks=3, kernel_replays=20,
                     precisions=("fp32", "tf32", "bf16", "fp16"))


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(MODELS / "precision_models.py", "2x16,8x16", config={"kind": "mlp"},
                     output=tmp_path_factory.mktemp("bench") / "mlp", progress=False).path


def test_cpu_bench_times_each_precision_eagerly_and_says_which_cannot_run(artifact: Path) -> None:
    report = run_bench(artifact, "cpu", settings=FAST, progress=False)
    for shape in report.shapes:
        fp32, bf16 = shape.variants["precision_fp32"], shape.variants["precision_bf16"]
        assert fp32.status == bf16.status == "ok", (fp32.reason, bf16.reason)
        assert fp32.precision_error == 0.0  # float32 eager on the build host's CPU
        assert 0 < bf16.precision_error < 2e-2 and bf16.median_us > 0
        assert bf16.kernel_us is None and bf16.pool_bytes is None  # no graph on a CPU
        for name in ("precision_tf32", "precision_fp16"):
            assert shape.variants[name].status == "skipped"
            assert "is not available on cpu" in shape.variants[name].reason
    table = render_table(report)
    assert "bf16 graph" in table and "of scale vs the float32 references" in table
    assert report.settings["precisions"] == ["fp32", "tf32", "bf16", "fp16"]


def test_bench_precision_options_are_checked(artifact: Path) -> None:
    with pytest.raises(BenchError, match="unknown precision fp8"):
        BenchSettings(precisions=("fp8",)).check()
    runner = CliRunner()
    cold = runner.invoke(cli, ["bench", str(artifact), "--cold", "--precision", "bf16"])
    assert cold.exit_code == 2 and "--precision only apply without --cold" in cold.output
    done = runner.invoke(cli, ["bench", str(artifact), "--device", "cpu", "--iters", "2",
                               "--repeats", "1", "--warmup", "0", "--precision", "bf16",
                               "--json"])
    assert done.exit_code == 0, done.output
    variants = json.loads(done.stdout)["shapes"][0]["variants"]
    assert variants["precision_bf16"]["status"] == "ok"
    assert variants["precision_bf16"]["precision_error"] > 0


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(MODELS / "precision_models.py", "2x3x16x16", config={"kind": "resnet"},
                     output=tmp_path_factory.mktemp("bench") / "cnn", progress=False).path


def test_bench_shows_each_precision_in_both_layouts_for_a_cnn(cnn: Path,
                                                               artifact: Path) -> None:
    """A column per layout: the channels-last graph beside the contiguous one, its error
    against the same references; a model without a convolution gets no channels-last
    column (nothing about it changes)."""
    settings = BenchSettings(iters=4, repeats=1, warmup=1, blocks=2, precisions=("fp32", "bf16"))
    report = run_bench(cnn, "cpu", settings=settings, progress=False)
    variants = report.shapes[0].variants
    for name in ("precision_fp32", "precision_fp32_channels_last", "precision_bf16",
                 "precision_bf16_channels_last"):
        assert variants[name].status == "ok", (name, variants[name].reason)
        assert variants[name].median_us > 0
    assert variants["precision_fp32_channels_last"].precision_error < 1e-5
    assert 0 < variants["precision_bf16_channels_last"].precision_error < 5e-2
    assert "channels-last, converted inside the call" in variants[
        "precision_bf16_channels_last"].note
    table = render_table(report)
    assert "bf16 channels-last graph" in table and "fp32 channels-last graph" in table
    plain = run_bench(artifact, "cpu", settings=settings, progress=False)
    assert not [n for n in plain.shapes[0].variants if n.endswith("channels_last")]
    skipped = run_bench(cnn, "cpu", progress=False, settings=BenchSettings(
        iters=2, repeats=1, warmup=0, blocks=1, precisions=("bf16",),
        skip=("precision_bf16_channels_last",)))
    assert skipped.shapes[0].variants["precision_bf16_channels_last"].status == "skipped"


@pytest.mark.gpu
def test_gpu_bench_times_channels_last_graphs_beside_contiguous_ones(cnn: Path) -> None:
    report = run_bench(cnn, "cuda", settings=FAST, progress=False)
    for shape in report.shapes:
        for precision, bound in (("fp32", 1e-2), ("tf32", 1e-2), ("bf16", 1e-1),
                                 ("fp16", 2e-2)):
            for name in (f"precision_{precision}", f"precision_{precision}_channels_last"):
                item = shape.variants[name]
                if item.status == "skipped":  # a GPU without TF32 / native bfloat16
                    assert "is not available on cuda" in item.reason
                    continue
                assert item.status == "ok", (name, item.reason)
                assert item.kernel_us and item.kernel_us > 0, name
                assert item.precision_error <= bound, (name, item.precision_error)
    print(render_table(report))


@pytest.mark.gpu
def test_gpu_bench_measures_every_precision_graph_side_by_side(artifact: Path) -> None:
    report = run_bench(artifact, "cuda", settings=FAST, progress=False)
    for shape in report.shapes:
        for precision, bound in (("fp32", 1e-4), ("tf32", 1e-2), ("bf16", 3e-2),
                                 ("fp16", 1e-2)):
            item = shape.variants[f"precision_{precision}"]
            if item.status == "skipped":  # a GPU without TF32 / native bfloat16
                assert "is not available on cuda" in item.reason
                continue
            assert item.status == "ok", (precision, item.reason)
            assert item.kernel_us and item.kernel_us > 0, precision
            assert item.pool_bytes is not None and item.pool_bytes >= 0
            assert item.precision_error <= bound, (precision, item.precision_error)
    print(render_table(report))
