"""Compiled mode on a GPU: dynamo and qkan's flash kernels, compiled == eager, the captured
graph replays inductor's kernels, precompiled graphs shipped by ``warm --compiled`` loaded
by default by a fresh process without tracing or importing the compiler, warm's probe
falling back to inductor's cache, refused on a mismatch. Findings are printed (run with
``-s``)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qkan_pack import Predictor, build
from qkan_pack.builder import warm, write_artifact
from qkan_pack.runtime import read_artifact, rebuild_model

from ..conftest import EXAMPLES, ROOT

pytestmark = pytest.mark.gpu

QKAN_CONFIG = {"width": [64, 64, 64], "reps": 3}  # the flash solver on a GPU


@pytest.fixture(scope="module")
def qkan64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compiled") / "qkan64"
    return build(EXAMPLES / "qkan_mlp.py", "1x64,32x64", output=out, config=QKAN_CONFIG).path


@pytest.fixture(scope="module")
def gpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compiled") / "gpt"
    return build(EXAMPLES / "hqkan_gpt.py", "1x32,4x32", output=out, dtype="int64",
                 config={"block_size": 32, "n_embd": 64, "hidden": 32}).path


def _eager(path: Path) -> torch.nn.Module:
    artifact = read_artifact(path)
    return rebuild_model(artifact, torch.device("cuda"), artifact.manifest.model.config)


def _inputs(path: Path, label_index: int) -> torch.Tensor:
    manifest = read_artifact(path).manifest
    (_, shape), = manifest.shapes[label_index].inputs
    if manifest.inputs[0].dtype == "int64":
        return torch.randint(0, 32, shape, device="cuda")
    return torch.randn(shape, device="cuda")


def test_dynamo_traces_qkan_flash_kernels(qkan64: Path) -> None:
    """Whether dynamo puts qkan's raw ``kernel[grid](...)`` launches into its graph (as
    user-defined Triton kernels) or breaks the graph around them; compiled == eager."""
    import torch._dynamo

    model = _eager(qkan64)
    x = torch.randn(32, 64, device="cuda")
    with torch.no_grad():
        explanation = torch._dynamo.explain(model)(x)
        torch._dynamo.reset()
        compiled = torch.compile(model, dynamic=False)(x)
        eager = model(x)
    user_kernels = sum(1 for graph in explanation.graphs for node in graph.graph.nodes
                       if "triton_kernel_wrapper" in str(node.target))
    print(f"\ndynamo on QKAN{QKAN_CONFIG['width']} (flash): {explanation.graph_count} graph(s), "
          f"{explanation.graph_break_count} break(s), {user_kernels} user-defined Triton kernel "
          f"node(s); break reasons: {[str(r.reason)[:160] for r in explanation.break_reasons]}")
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["qkan64", "gpt"])
def test_compiled_mode_equals_eager_and_replays_fused_kernels(name: str,
                                                              request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(name)
    predictor = Predictor.load(path, device="cuda", compiled="on")
    print(f"\n{name}: {predictor.report.compiled}; stages {predictor.report.stages}")
    assert predictor.report.compiled.startswith("precompiled: 2 graph(s) traced and "
                                                "compiled here"), predictor.report
    assert all(r.policy == "full" for r in predictor.report.shapes)
    model = _eager(path)
    for index in (0, 1, 0):
        x = _inputs(path, index)
        with torch.no_grad():
            torch.testing.assert_close(predictor(x), model(x), rtol=1e-4, atol=1e-5)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        predictor(_inputs(path, 0))
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"{name}: {len(kernels)} GPU events per replay, e.g. {sorted(set(kernels))[:8]}")
    assert any(k.startswith("triton_") for k in kernels), kernels  # inductor's generated kernels
    predictor.close()


FRESH_COMPILED_LOAD = """
import json, sys
import torch
from qkan_pack import Predictor
from qkan_pack.runtime import read_artifact, rebuild_model
path, mode = sys.argv[1], sys.argv[2]
predictor = Predictor.load(path, device="cuda", **({} if mode == "default" else {"compiled": mode}))
imported = [m for m in ("torch._dynamo", "torch._inductor", "networkx") if m in sys.modules]
from torch._dynamo.utils import counters
artifact = read_artifact(path)
model = rebuild_model(artifact, torch.device("cuda"), artifact.manifest.model.config)
worst = 0.0
integer = artifact.manifest.inputs[0].dtype == "int64"
for entry in artifact.manifest.shapes:
    (_, shape), = entry.inputs
    x = torch.randint(0, 32, shape, device="cuda") if integer else torch.randn(shape, device="cuda")
    with torch.no_grad():
        worst = max(worst, float((predictor(x) - model(x)).abs().max()))
print(json.dumps({"compiled": predictor.report.compiled, "warnings": predictor.report.warnings,
                  "stages": predictor.report.stages, "worst": worst,
                  "traced": int(counters["stats"]["unique_graphs"]),
                  "inductor": dict(counters["inductor"]), "aot": dict(counters["aot_autograd"]),
                  "imported": imported}))
"""


def _fresh(path: Path, scratch: Path, compiled: str = "default") -> dict:
    """What a fresh process's load with ``compiled`` (the default mode: left out) serves."""
    caches = {name: scratch / name.lower() for name in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
    for directory in caches.values():
        directory.mkdir(parents=True)
    env = {**os.environ, **{k: str(v) for k, v in caches.items()},
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", FRESH_COMPILED_LOAD, str(path), compiled], env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    seen["user_caches_empty"] = all(not any(d.iterdir()) for d in caches.values())
    return seen


@pytest.mark.parametrize("name", ["qkan64", "gpt"])
def test_warm_compiled_ships_precompiled_graphs_a_fresh_process_does_not_trace(
        name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    path = request.getfixturevalue(name)
    result = warm(path, "cuda", compiled=True)
    # the probe's report names the forms: AOTInductor packages, run without inductor's Python
    assert result.compiled == ("precompiled graphs (AOTInductor packages run by torch's C++ "
                               "loader)"), result
    (kernel_set,) = read_artifact(path).manifest.kernels
    assert kernel_set.details["precompiled"] in read_artifact(path).files
    assert "inductor" not in kernel_set.details
    seen = _fresh(path, tmp_path)
    print(f"\nwarm --compiled {name}: {result.files} files, {result.bytes / 2**20:.2f} MiB; "
          f"fresh process: {seen['compiled']}; stages {seen['stages']}; inductor {seen['inductor']}; "
          f"imported by the load: {seen['imported']}")
    assert seen["compiled"].startswith("precompiled: 2 graph(s) shipped with the kernel "
                                       "set"), seen
    assert seen["compiled"].endswith("AOTInductor packages run by torch's C++ loader"), seen
    assert seen["imported"] == [], seen  # the start pays for none of the compiler's imports
    assert seen["traced"] == 0, seen
    assert not [w for w in seen["warnings"] if "compile" in w], seen["warnings"]
    assert seen["inductor"].get("fxgraph_cache_miss", 0) == 0, seen["inductor"]
    assert seen["user_caches_empty"], "the user's Triton/inductor caches were written"
    assert seen["worst"] < 1e-4


def test_a_mismatched_inductor_cache_is_refused_and_today_serves(qkan64: Path,
                                                                 tmp_path: Path) -> None:
    if not read_artifact(qkan64).manifest.kernels:
        warm(qkan64, "cuda", compiled=True)
    artifact = read_artifact(qkan64)
    other = [dataclasses.replace(k, key="sm00-elsewhere") for k in artifact.manifest.kernels]
    moved = tmp_path / "moved"
    write_artifact(moved, dataclasses.replace(artifact.manifest, kernels=tuple(other)),
                   dict(artifact.files))
    with pytest.warns(UserWarning, match="no shipped kernels for"):
        predictor = Predictor.load(moved, device="cuda", compiled="shipped")
    assert predictor.report.compiled.startswith("off ("), predictor.report.compiled
    x = torch.randn(1, 64, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(predictor(x), _eager(moved)(x), rtol=1e-5, atol=1e-6)
