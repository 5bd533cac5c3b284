"""``qkan-pack bench``: the CPU path end to end, the report's JSON schema, table and plot.

The GPU-only figures (bare replay, kernel floor, pool memory) are exercised here through
synthetic results so their arithmetic and rendering are covered without a GPU; one ``gpu``
test runs the real thing where CUDA exists.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from qkan_pack import BenchError
from qkan_pack.bench import (
    CPU_NOTE,
    SCHEMA,
    BenchReport,
    BenchSettings,
    ShapeResult,
    render_table,
    run_bench,
    write_json,
    write_plot,
)
from qkan_pack.bench._results import _spread, finish_shape
from qkan_pack.bench._timing import split
from qkan_pack.bench._variants import Variant
from qkan_pack.cli import cli

FAST = BenchSettings(iters=6, repeats=2, warmup=1, blocks=3)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VARIANT_KEYS = {"name", "label", "status", "reason", "note", "median_us", "p90_us", "p99_us",
                "mean_us", "min_us", "spread_pct", "throughput_cps", "throughput_spread_pct",
                "repeats", "first_call_s", "warmup_s", "max_abs_diff_vs_eager",
                "speedup_vs_eager", "overhead_vs_bare", "ratio_to_kernel", "vs_exact_call",
                "kernel_us", "pool_bytes", "precision_error"}


@pytest.fixture(scope="module")
def cpu_report(mlp_artifact: Path) -> BenchReport:
    return run_bench(mlp_artifact, "cpu", settings=FAST, progress=False)


def test_cpu_bench_compares_eager_and_predictor_only(cpu_report: BenchReport) -> None:
    assert [s.label for s in cpu_report.shapes] == ["1x2", "64x2"]
    for shape in cpu_report.shapes:
        assert set(shape.variants) == {"eager", "predictor"}
        assert shape.kernel_us is None
        for item in shape.variants.values():
            assert item.status == "ok", item.reason
            assert 0 < item.min_us <= item.median_us <= item.p90_us <= item.p99_us
            assert len(item.repeats) == 2 and all(r["calls"] == 6 for r in item.repeats)
            assert item.throughput_cps > 0
            assert item.max_abs_diff_vs_eager == 0.0  # the same eager model on the CPU
        assert shape.variants["eager"].speedup_vs_eager == pytest.approx(1.0)
    assert cpu_report.memory is None
    assert CPU_NOTE in cpu_report.notes


def test_json_schema(cpu_report: BenchReport, tmp_path: Path) -> None:
    data = json.loads(write_json(cpu_report, tmp_path / "deep" / "bench.json").read_text())
    assert data["schema"] == SCHEMA
    assert {"artifact", "device", "machine", "versions", "settings", "load", "shapes", "memory",
            "notes", "created"} <= set(data)
    assert "cold_start" not in data  # cold starts have their own report (bench --cold)
    assert {"torch", "triton", "qkan", "qkan_pack"} <= set(data["versions"])
    assert {"hostname", "platform", "python", "cpu", "gpu"} <= set(data["machine"])
    assert data["artifact"]["digest"].startswith("sha256:")
    assert data["settings"]["iters"] == 6 and data["settings"]["repeats"] == 2
    assert data["load"]["capture_policy"] == "eager (no CUDA)"
    for shape in data["shapes"]:
        assert {"label", "kernel_us", "kernel_method", "variants"} <= set(shape)
        for item in shape["variants"].values():
            assert set(item) == VARIANT_KEYS


def test_table_says_graphs_need_cuda(cpu_report: BenchReport) -> None:
    table = render_table(cpu_report)
    assert "CUDA graphs need CUDA" in table
    for text in ("shape 1x2", "shape 64x2", "eager", "predictor", "vs eager", "spread"):
        assert text in table


def test_plot_is_a_png(cpu_report: BenchReport, tmp_path: Path) -> None:
    path = write_plot(cpu_report, tmp_path / "bench.png")
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_cli_bench_writes_json_and_plot(mlp_artifact: Path, tmp_path: Path) -> None:
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    result = CliRunner().invoke(cli, ["bench", str(mlp_artifact), "--device", "cpu", "--iters", "3",
                                      "--repeats", "2", "--warmup", "1", "--json", str(out_json),
                                      "--plot", str(out_png)])
    assert result.exit_code == 0, result.output
    assert "CUDA graphs need CUDA" in result.output
    assert f"wrote {out_json}" in result.output
    assert json.loads(out_json.read_text())["device"] == "cpu"
    assert out_png.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cli_bench_cuda_without_cuda_is_a_one_line_error(mlp_artifact: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", str(mlp_artifact), "--device", "cuda"])
    assert result.exit_code == 1
    assert "CUDA is not available" in result.output


def test_cli_bench_rejects_bad_options(mlp_artifact: Path) -> None:
    for args in (["--iters", "0"], ["--skip", "eager"], ["--repeats", "0"]):
        result = CliRunner().invoke(cli, ["bench", str(mlp_artifact), *args])
        assert result.exit_code == 2, (args, result.output)


def test_bench_help_does_not_import_torch() -> None:
    code = ("import sys; from click.testing import CliRunner; from qkan_pack.cli import cli; "
            "r = CliRunner().invoke(cli, ['bench', '--help']); "
            "assert r.exit_code == 0 and '--cold' in r.output, r.output; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_settings_are_checked() -> None:
    with pytest.raises(BenchError, match="iters"):
        BenchSettings(iters=0).check()
    with pytest.raises(BenchError, match="skippable"):
        BenchSettings(skip=("predictor",)).check()
    BenchSettings(skip=("torch_compile", "bare_graph")).check()


def test_blocks_and_spread() -> None:
    assert split(10, 3) == [4, 3, 3]
    assert split(2, 10) == [1, 1]
    assert sum(split(301, 10)) == 301
    assert _spread([100.0, 110.0]) == pytest.approx(10.0)
    assert _spread([5.0]) is None


def _synthetic(name: str, seconds: float, status: str = "ok") -> Variant:
    variant = Variant(name, status=status, reason="" if status == "ok" else "why")
    if status == "ok":
        variant.samples = [[seconds] * 5, [seconds * 1.02] * 5]
        variant.throughput = [1 / seconds, 0.98 / seconds]
    return variant


def _gpu_like_report() -> BenchReport:
    shapes = []
    for label, scale in (("1x2", 1.0), ("64x2", 2.0)):
        result = ShapeResult(label=label, kernel_us=5.0 * scale, kernel_method="events")
        variants = [_synthetic("eager", 500e-6 * scale), _synthetic("predictor", 22e-6 * scale),
                    _synthetic("bare_graph", 20e-6 * scale),
                    _synthetic("qkan_compile_inference", 21e-6 * scale),
                    _synthetic("torch_compile", 0.0, status="failed")]
        variants[1].max_abs_diff = float("inf")  # must still serialise as JSON
        shapes.append(finish_shape(variants, result))
    memory = {"method": "m", "predictor_pool_bytes": 2 << 20,
              "predictor_shapes": {"1x2": 0, "64x2": 2 << 20}, "shared_pool_bytes": 2 << 20,
              "shared_pool_growth_by_shape": {"64x2": 2 << 20, "1x2": 0},
              "private_pools_bytes": 4 << 20, "private_pool_by_shape": {"64x2": 2 << 20, "1x2": 2 << 20},
              "largest_shape": "64x2", "largest_alone_bytes": 2 << 20, "shared_over_largest_alone": 1.0}
    return BenchReport(artifact={"path": "a", "model": "m.py::build_model"}, device="cuda:0",
                       machine={"gpu": "NVIDIA H200"}, versions={"torch": "2.11.0"},
                       settings={"iters": 5, "repeats": 2, "interleaving": "rr", "latency": "l"},
                       load={}, shapes=shapes, memory=memory,
                       created="2026-12-02T00:00:00+00:00")


def test_ratios_against_eager_bare_replay_and_kernel_floor() -> None:
    report = _gpu_like_report()
    predictor = report.shape("1x2").variants["predictor"]
    assert predictor.speedup_vs_eager == pytest.approx(500 / 22)
    assert predictor.overhead_vs_bare == pytest.approx(22 / 20)
    assert predictor.ratio_to_kernel == pytest.approx(22.22 / 5)
    assert predictor.spread_pct == pytest.approx(2.0)
    failed = report.shape("1x2").variants["torch_compile"]
    assert failed.status == "failed" and failed.median_us is None and failed.speedup_vs_eager is None


def test_gpu_like_report_renders_and_serialises(tmp_path: Path) -> None:
    report = _gpu_like_report()
    table = render_table(report)
    for text in ("GPU kernel time per call 5.0 us", "bare replay", "one shared pool",
                 "one private pool per shape", "torch.compile r-o", "failed: why", "1.10x"):
        assert text in table, text
    data = json.loads(write_json(report, tmp_path / "g.json").read_text())
    assert data["shapes"][0]["variants"]["predictor"]["max_abs_diff_vs_eager"] is None
    assert write_plot(report, tmp_path / "g.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.gpu
def test_gpu_bench_measures_every_variant(mlp_artifact: Path) -> None:
    settings = BenchSettings(iters=20, repeats=2, warmup=3, kernel_replays=20)
    report = run_bench(mlp_artifact, "cuda", settings=settings, progress=False)
    for shape in report.shapes:
        assert shape.kernel_us and shape.kernel_us > 0, shape.kernel_method
        for name in ("eager", "predictor", "bare_graph", "qkan_compile_inference", "torch_compile"):
            item = shape.variants[name]
            assert item.status == "ok", (name, item.reason)
            assert item.max_abs_diff_vs_eager < 1e-4, name
    assert report.memory and report.memory["private_pools_bytes"] >= report.memory["largest_alone_bytes"]
    assert "NVIDIA" in (report.machine["gpu"] or "") or report.machine["gpu"]


ORDER_MODEL = '''
import torch


class Difference(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x - 2 * y


def build_model() -> torch.nn.Module:
    return Difference()
'''


def test_named_inputs_reach_every_variant_by_name(tmp_path: Path) -> None:
    """Inputs declared by name in another order than ``forward``'s: before the fix the bench's
    eager baseline called ``model(*inputs)`` positionally, computed ``y - 2x`` and reported
    the (correct) predictor as off by that much."""
    from qkan_pack import build

    source = tmp_path / "order.py"
    source.write_text(ORDER_MODEL)
    artifact = build(source, [{"y": (2, 3), "x": (2, 3)}], output=tmp_path / "a").path
    report = run_bench(artifact, "cpu", settings=FAST, progress=False)
    (shape,) = report.shapes
    assert shape.variants["predictor"].status == "ok"
    assert shape.variants["predictor"].max_abs_diff_vs_eager == 0.0


def test_a_padded_call_is_timed_beside_the_exact_call(tmp_path: Path) -> None:
    from qkan_pack import build

    from ..conftest import MODELS

    path = build(MODELS / "pad_models.py", "1x6,8x6", config={"kind": "rows"},
                 output=tmp_path / "rows", pad={"x": 0.0}, progress=False).path
    report = run_bench(path, "cpu", settings=FAST, progress=False)
    padded = report.shape("8x6").variants["predictor_padded"]
    assert padded.status == "ok" and padded.vs_exact_call is not None
    assert padded.max_abs_diff_vs_eager is not None and padded.max_abs_diff_vs_eager < 1e-5
    assert "input dim 0 7: padded into this shape" in padded.note
    assert "predictor_padded" not in report.shape("1x6").variants  # a batch of one: minimal
    assert "the exact call" in render_table(report)
