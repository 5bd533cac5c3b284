"""``qkan-pack bench --cold``: fresh processes on the CPU end to end, the import breakdown,
the summary arithmetic, table, JSON and plot (GPU stages: tests/runtime GPU tests and the
lead's H200 runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from qkan_pack import BenchError
from qkan_pack.bench import (
    COLD_SCHEMA,
    ColdSettings,
    render_cold,
    run_cold,
    write_cold_json,
    write_cold_plot,
)
from qkan_pack.bench._cold import imports_by_package, summarise
from qkan_pack.cli import cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def cold_report(mlp_artifact: Path) -> dict[str, Any]:
    settings = ColdSettings(runs=2, calls=3, variants=("predictor", "torch_compile"))
    return run_cold(mlp_artifact, "cpu", settings=settings, progress=False)


def test_fresh_processes_time_every_stage_to_the_first_result(cold_report: dict) -> None:
    summary = cold_report["variants"]["predictor"]
    assert summary["ok_runs"] == 2 and summary["errors"] == [], summary["errors"]
    run = summary["runs"][0]
    stages = dict(run["stages"])
    for name in ("python start", "import torch", "import qkan_pack", "verify", "import",
                 "build", "weights", "first forward", "first call"):
        assert stages[name] >= 0, name
    assert "cuda init" not in stages and "capture" not in stages  # CPU: no CUDA stages
    assert run["total_s"] >= sum(stages.values()) * 0.9  # the stages cover the process
    assert run["wall_s"] >= run["total_s"]
    total = summary["total_s"]
    assert total["min"] <= total["median"] <= total["max"] and total["n"] == 2
    assert summary["over_import_torch_s"]["median"] == pytest.approx(
        total["median"] - summary["import_torch_s"]["median"], abs=total["max"] - total["min"] + 1e-9)


def test_imports_are_broken_down_by_package_and_heavy_ones_never_ran(cold_report: dict) -> None:
    summary = cold_report["variants"]["predictor"]
    imports = summary["imports_s"]
    assert next(iter(imports)) == "torch"  # the largest by far
    assert {"torch", "qkan", "qkan_pack"} <= set(imports)
    assert "sympy" not in imports  # deferred while the model source imported qkan
    assert summary["modules"] == {"qkan": "deferred", "sympy": "absent", "matplotlib": "deferred",
                                  "matplotlib.pyplot": "deferred", "triton": "absent"}


def test_torch_compile_needs_cuda_and_says_so(cold_report: dict) -> None:
    assert "torch_compile" not in cold_report["variants"]
    assert any("reduce-overhead" in note for note in cold_report["notes"])


def test_table_json_and_plot(cold_report: dict, tmp_path: Path) -> None:
    table = render_cold(cold_report)
    for text in ("process start -> first result", "over import torch", "import torch",
                 "model source import", "imports by top-level package", "sympy absent",
                 "caches emptied per process", "modules compiled from source in the process"):
        assert text in table, text
    data = json.loads(write_cold_json(cold_report, tmp_path / "c.json").read_text())
    assert data["schema"] == COLD_SCHEMA and data["machine"]["cpu"]
    assert write_cold_plot(cold_report, tmp_path / "c.png").read_bytes()[:8] == PNG_MAGIC


def test_a_report_with_a_bytecode_cache_writes_its_json(mlp_artifact: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the settings kept the cache as a Path and ``--json`` failed after every run
    ("Object of type PosixPath is not JSON serializable", seen on the H200)."""
    from qkan_pack.bench import _cold

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "tiny.py").write_text("X = 1\n")
    monkeypatch.setattr(_cold, "import_roots", lambda: [str(tmp_path / "src")])
    settings = ColdSettings(runs=1, calls=2, variants=("predictor",),
                            bytecode_cache=tmp_path / "pyc")
    report = run_cold(mlp_artifact, "cpu", settings=settings, progress=False)
    written = json.loads(write_cold_json(report, tmp_path / "cold.json").read_text())
    assert written["settings"]["bytecode_cache"] == str(tmp_path / "pyc")
    assert written["bytecode_cache"]["path"] == str(tmp_path / "pyc")
    assert written["bytecode_cache"]["pyc_files"] == 1


def test_a_bytecode_cache_that_stays_empty_is_an_error(tmp_path: Path) -> None:
    """Before: compileall's exit status 1 was accepted whatever its cause, so a compile that
    wrote nothing where the processes look (the H200's Python 3.12) measured the host without
    bytecode under a header saying it had bytecode."""
    from qkan_pack.bench._cold import compile_bytecode

    with pytest.raises(BenchError, match=r"no \.py file in the roots"):
        compile_bytecode(tmp_path / "pyc", roots=[str(tmp_path / "missing")])
    stale = tmp_path / "pyc" / "leftover.cpython-311.pyc"  # audit: a leftover counted as written
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "broken.py").write_text("def (:\n")  # compiles to nothing
    with pytest.raises(BenchError, match=r"broken\.py has no \.pyc there"):
        compile_bytecode(tmp_path / "pyc", roots=[str(tmp_path / "src")])
    (tmp_path / "src" / "broken.py").write_text("X = 1\n")
    assert compile_bytecode(tmp_path / "pyc", roots=[str(tmp_path / "src")])["pyc_files"] >= 1


def test_import_time_lines_add_up_per_package() -> None:
    stderr = "\n".join([
        "import time: self [us] | cumulative | imported package",
        "import time:      1000 |       1000 |     sympy.core",
        "import time:      2000 |       3000 |   sympy",
        "import time:    500000 |     503000 | torch",
        "import time:       300 |        300 |   torch._C",
        "some other stderr line",
    ])
    assert imports_by_package(stderr) == pytest.approx({"torch": 0.5003, "sympy": 0.003})
    assert list(imports_by_package(stderr)) == ["torch", "sympy"]


def test_summary_keeps_failures_and_the_profiled_run_apart() -> None:
    good = {"stages": [["import torch", 1.0], ["first call", 0.5]], "total_s": 2.0,
            "first_call_us": 500.0, "steady_us": 50.0, "calls_to_fast": 2, "imports_s": {"torch": 1}}
    slow = {**good, "total_s": 3.0, "stages": [["import torch", 1.5], ["first call", 0.5]]}
    failed = {"stages": [], "error": "RuntimeError: boom"}
    profiled = {**good, "total_s": 99.0, "profiled": True, "profile": {"cumulative": []}}
    summary = summarise([good, failed, slow, profiled], timed=3)
    assert summary["ok_runs"] == 2 and summary["errors"] == ["RuntimeError: boom"]
    assert summary["total_s"] == {"median": 2.5, "min": 2.0, "max": 3.0, "spread_pct": 50.0, "n": 2}
    assert summary["over_import_torch_s"]["median"] == pytest.approx(1.25)
    assert summary["stages_s"] == {"import torch": 1.25, "first call": 0.5}
    assert summary["profile"] == {"cumulative": []}
    assert summarise([failed], timed=1)["ok_runs"] == 0


def test_settings_are_checked() -> None:
    with pytest.raises(BenchError, match="choose from"):
        ColdSettings(variants=("eager",)).check()
    with pytest.raises(BenchError, match="runs"):
        ColdSettings(runs=0).check()


def test_every_stage_a_load_records_has_a_row_in_the_table(cold_report: dict) -> None:
    """The table and plot list ``STAGES`` only: a stage the load records but ``STAGES``
    lacks is silently missing from the breakdown (the reference self-test was, and the
    rows did not add up to the load). Checked on the names in the runtime's source, GPU
    stages included, and on what a CPU run recorded."""
    import re

    from qkan_pack.bench._cold import STAGES
    from qkan_pack.bench._cold_render import STAGE_LABELS

    runtime = Path(__file__).parents[2] / "qkan_pack" / "runtime"
    pattern = re.compile(r'(?:stage\(|timed_stage\(stages, |stages\[)"([a-z -]+)"')
    named = {m for f in runtime.glob("*.py") for m in pattern.findall(f.read_text())}
    assert {"verify", "cuda init", "kernel cache", "reference self-test", "capture"} <= named
    recorded = {name for name, _ in cold_report["variants"]["predictor"]["runs"][0]["stages"]}
    assert named | recorded <= set(STAGES) == set(STAGE_LABELS)


def test_cli_cold_options_need_cold(mlp_artifact: Path) -> None:
    for args in (["--runs", "2"], ["--profile"], ["--variants", "compiled"], ["--keep-caches"],
                 ["--bytecode-cache", "pyc"]):
        result = CliRunner().invoke(cli, ["bench", str(mlp_artifact), "--device", "cpu", *args])
        assert result.exit_code == 2 and "only apply with --cold" in result.output, args


def test_cli_side_by_side_options_are_refused_with_cold(mlp_artifact: Path) -> None:
    """Audit: ``bench --cold --iters 5`` ran the cold benchmark and dropped ``--iters``."""
    for args in (["--iters", "5"], ["--repeats", "3"], ["--warmup", "1"], ["--skip", "bare_graph"]):
        result = CliRunner().invoke(cli, ["bench", str(mlp_artifact), "--device", "cpu",
                                          "--cold", *args])
        assert result.exit_code == 2 and "only apply without --cold" in result.output, args
    result = CliRunner().invoke(cli, ["bench", str(mlp_artifact), "--cold", "--variants", "eager"])
    assert result.exit_code == 1 and "choose from" in result.output


def _gpu_like(gpu_us: float, steady_us: float) -> dict[str, Any]:
    run = {"stages": [["import torch", 2.6], ["cuda init", 0.1], ["capture", 0.02],
                      ["first call", 0.001]], "total_s": 3.0, "first_call_us": 300.0,
           "steady_us": steady_us, "calls_to_fast": 1, "imports_s": {"torch": 2.4},
           "steady": {"shape": "1x128", "predictor_us": steady_us, "bare_replay_us": 200.0,
                      "predictor_over_bare": steady_us / 200.0, "gpu_us": gpu_us,
                      "gpu_method": "events"}}
    return summarise([run, {**run, "total_s": 3.2}], timed=2)


def test_gpu_figures_render_with_the_compiled_over_today_ratio(tmp_path: Path) -> None:
    report = {"artifact": {"path": "gpt", "model": "m.py::build_model"}, "device": "cuda:0",
              "machine": {"gpu": "NVIDIA H200"}, "settings": {"runs": 2, "fresh_caches": True},
              "caches": "emptied", "created": "2026-12-04T00:00:00+00:00", "notes": [],
              "variants": {"predictor": _gpu_like(206.8, 227.0), "compiled": _gpu_like(150.0, 170.0)}}
    assert report["variants"]["compiled"]["steady"]["gpu_us"] == 150.0
    table = render_cold(report)
    for text in ("CUDA init", "graph capture", "GPU time per call (us)", "predictor / bare replay",
                 "compiled / today's graph, GPU time per call: 0.725x", "compiled mode"):
        assert text in table, text
    assert write_cold_plot(report, tmp_path / "g.png").read_bytes()[:8] == PNG_MAGIC


def _bytecode_of_a_fresh_import(root: Path, env: dict[str, str]) -> dict[str, Any]:
    """``bytecode_use`` in a new interpreter that imported the package under ``root``."""
    import os
    import subprocess
    import sys

    code = ("import json, sys, time; launched = time.time(); sys.path.insert(0, sys.argv[1]); "
            "import pkgx.mod; from qkan_pack.bench._cold_child import bytecode_use; "
            "print(json.dumps(bytecode_use(launched)))")
    done = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True,
                          env={**os.environ, **env}, check=True)
    return json.loads(done.stdout)


def test_the_report_counts_modules_compiled_from_source_and_the_cache_removes_them(tmp_path: Path) -> None:
    """A host whose packages have no .pyc compiles them in every start (the H200 lent here:
    ``import torch`` 4.2 s against 1.3 s with bytecode); the report says so, and
    ``--bytecode-cache`` measures the host as pip would have installed it."""
    from qkan_pack.bench._cold import compile_bytecode

    package = tmp_path / "src" / "pkgx"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("X = 1\n")
    (package / "mod.py").write_text("Y = 2\n")
    no_write = {"PYTHONDONTWRITEBYTECODE": "1"}
    assert _bytecode_of_a_fresh_import(tmp_path / "src", no_write)["by_package"]["pkgx"] == 2
    written_now = _bytecode_of_a_fresh_import(tmp_path / "src", {"PYTHONDONTWRITEBYTECODE": ""})
    assert written_now["by_package"]["pkgx"] == 2  # a .pyc written after launch: compiled here
    cache = compile_bytecode(tmp_path / "pyc", roots=[str(tmp_path / "src")])
    assert cache["roots"] == [str(tmp_path / "src")] and cache["seconds"] >= 0
    cached = _bytecode_of_a_fresh_import(tmp_path / "src", {**no_write,
                                                            "PYTHONPYCACHEPREFIX": cache["path"]})
    assert "pkgx" not in cached["by_package"] and cached["prefix"] == cache["path"]
