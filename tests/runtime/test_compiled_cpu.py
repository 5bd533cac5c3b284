"""Compiled mode without a GPU: options, the fallback when nothing is shipped, and (slow:
inductor's CPU backend compiles C++ with gcc) compiled outputs against eager ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from qkan_pack import LoadOptions, Predictor, build
from qkan_pack.errors import LoadOptionError
from qkan_pack.runtime import PrecompiledExport, _compiled, read_artifact, rebuild_model
from qkan_pack.runtime._precompiled import Plan, ShapePlan, TensorRef

from ..conftest import MODELS, ROOT


@pytest.fixture(scope="module")
def plain_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compiled") / "plain"
    return build(MODELS / "plain_mlp.py", "1x2,8x2", output=out).path


def _eager_twin(path: Path) -> torch.nn.Module:
    return rebuild_model(read_artifact(path), torch.device("cpu"), {})


def test_compiled_mode_is_checked_before_loading() -> None:
    with pytest.raises(LoadOptionError, match="compiled='fast': one of auto, off, shipped, on") as info:
        LoadOptions(compiled="fast")
    assert info.value.option == "compiled"
    assert LoadOptions().compiled == "auto"


class _AutoLoad:
    """What ``serve_compiled`` reads of a load, for the default mode's choice alone."""

    def __init__(self, gated: bool = False) -> None:
        self.options = LoadOptions()
        self.report = SimpleNamespace(compiled="off", precision=SimpleNamespace(gated=gated))
        self.artifact, self.target, self.samples, self.export = None, torch.device("cuda"), [], None
        self.warned: list[str] = []

    def eager_runner(self) -> str:
        return "eager"

    def fall_back(self, why: str) -> str:
        self.warned.append(why)
        self.report.compiled = f"off ({why})"
        return "eager"


def _plan(*forms: str) -> bytes:
    ref = TensorRef(kind="input", name="0", shape=(1, 2), dtype="float32")
    return Plan(torch=torch.__version__, device="cuda:0", config={}, shapes=tuple(
        ShapePlan(label=str(i), file=f"{i}.pt2", inputs=(ref,), args=(ref,), outputs=(0,), form=form)
        for i, form in enumerate(forms))).to_json()


@pytest.mark.parametrize(
    ("shipped", "gated", "served", "said", "warned"),
    [
        (None, False, "eager", "off", []),  # nothing shipped for this host: quietly the default mode
        (_plan("aoti", "aoti"), False, "compiled", "precompiled", []),
        (_plan("aoti", "inductor"), False, "eager", "off (auto: the shipped precompiled graphs are "
         "inductor's Python code, whose load imports inductor; compiled='shipped' runs them)", []),
        (_plan("aoti", "aoti"), True, "eager", "off", []),  # compiled mode is float32 only
        (b"{", False, "eager", "off (the precompiled plan is unreadable", ["the precompiled plan"]),
    ],
)
def test_the_default_mode_compiles_where_every_shape_ships_an_aotinductor_package(
        shipped: bytes | None, gated: bool, served: str, said: str, warned: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``compiled="auto"`` (the default) serves shipped AOTInductor packages, which load
    without inductor's imports; never inductor's form, which costs the start its imports."""
    asked: list[object] = []

    def precompiled(load: object, found: object) -> tuple[str, str]:
        asked.append(found)
        load.report.compiled = "precompiled: 2 graph(s) shipped"  # type: ignore[attr-defined]
        return "compiled", ""

    monkeypatch.setattr(_compiled, "host_set", lambda artifact, target: ("set", ""))
    monkeypatch.setattr(_compiled, "shipped_precompiled", lambda artifact, kernel_set, why: (
        (None, "no precompiled graphs") if shipped is None else (("key", shipped, {}), "shipped")))
    monkeypatch.setattr(_compiled, "_serve_precompiled", precompiled)
    load = _AutoLoad(gated)
    assert _compiled.serve_compiled(load) == served  # type: ignore[arg-type]
    assert load.report.compiled.startswith(said)
    assert [w[:len(p)] for w, p in zip(load.warned, warned)] == warned and len(load.warned) == len(warned)
    assert bool(asked) == (served == "compiled")


def test_shipped_packages_this_host_refuses_fall_back_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_compiled, "host_set", lambda artifact, target: ("set", ""))
    monkeypatch.setattr(_compiled, "shipped_precompiled",
                        lambda artifact, kernel_set, why: (("key", _plan("aoti"), {}), "shipped"))
    monkeypatch.setattr(_compiled, "_serve_precompiled",
                        lambda load, found: (None, "this torch cannot load the AOTInductor package"))
    load = _AutoLoad()
    assert _compiled.serve_compiled(load) == "eager"  # type: ignore[arg-type]
    assert load.warned == ["this torch cannot load the AOTInductor package"]


def test_shipped_packages_that_disagree_fall_back_instead_of_refusing_a_default_load(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nobody asked for them: ``"shipped"`` refuses such a load (``SelfTestError``), the
    default serves the default graphs, saying why."""
    from qkan_pack.errors import SelfTestError

    def disagree(load: object, found: object) -> None:
        raise SelfTestError(shape="1x2", compared="precompiled outputs", max_abs=1.0,
                            tolerance=(1e-5, 1e-6), hint="load without compiled mode")

    monkeypatch.setattr(_compiled, "host_set", lambda artifact, target: ("set", ""))
    monkeypatch.setattr(_compiled, "shipped_precompiled",
                        lambda artifact, kernel_set, why: (("key", _plan("aoti"), {}), "shipped"))
    monkeypatch.setattr(_compiled, "_serve_precompiled", disagree)
    load = _AutoLoad()
    assert _compiled.serve_compiled(load) == "eager"  # type: ignore[arg-type]
    (why,) = load.warned
    assert why.startswith("the shipped AOTInductor packages disagree with the build references "
                          "(self-test failed for shape 1x2: precompiled outputs differ by up to 1")


def test_a_default_cpu_load_runs_beside_another_threads_compiled_load(plain_artifact: Path) -> None:
    """A default load took the compiled-mode lock (``PROCESS_CACHES``) whatever its device,
    so default loads on several threads ran one after another; on a CPU, where no forms
    ship, it takes none."""
    import threading

    from qkan_pack.runtime._kernels import PROCESS_CACHES

    held, release, order = threading.Event(), threading.Event(), []

    def hold() -> None:
        with PROCESS_CACHES:
            held.set()
            release.wait(timeout=60)
            order.append("released")

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(timeout=60)
    try:
        Predictor.load(plain_artifact)
        order.append("loaded")
    finally:
        release.set()
        holder.join()
    assert order == ["loaded", "released"]


def test_a_default_load_without_shipped_forms_says_nothing_of_compiled_mode(plain_artifact: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predictor = Predictor.load(plain_artifact)
    assert predictor.report.compiled == "off" and "compiled mode" not in str(predictor.report)


def test_shipped_without_a_shipped_cache_warns_and_serves_as_today(plain_artifact: Path) -> None:
    with pytest.warns(UserWarning, match="precompiled graphs ship for GPU hosts only"):
        predictor = Predictor.load(plain_artifact, compiled="shipped")
    assert predictor.report.compiled.startswith("off (compiled='shipped' but")
    assert "compile" not in predictor.report.stages
    model = _eager_twin(plain_artifact)
    x = torch.randn(8, 2)
    with torch.no_grad():
        assert torch.equal(predictor(x), model(x))


@pytest.mark.slow
def test_compiled_mode_equals_eager_on_the_cpu(plain_artifact: Path) -> None:
    predictor = Predictor.load(plain_artifact, compiled="on")
    report = predictor.report
    assert report.compiled == ("precompiled: 2 graph(s) traced and compiled here; run by "
                               "inductor's Python")
    assert report.stages["compile"] > 0
    assert "compiled mode: precompiled" in str(report)
    model = _eager_twin(plain_artifact)
    for batch in (1, 8, 1):
        x = torch.randn(batch, 2)
        with torch.no_grad():
            torch.testing.assert_close(predictor(x), model(x), rtol=1e-5, atol=1e-6)


def test_a_model_torch_compile_cannot_compile_is_served_as_today(
        plain_artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("dynamo cannot trace this")

    monkeypatch.setattr(torch, "compile", refuse)
    with pytest.warns(UserWarning, match="torch.compile failed: RuntimeError: dynamo cannot"):
        predictor = Predictor.load(plain_artifact, compiled="on")
    assert predictor.report.compiled.startswith("off (torch.compile failed")
    x = torch.randn(1, 2)
    with torch.no_grad():
        assert torch.equal(predictor(x), _eager_twin(plain_artifact)(x))


@pytest.mark.slow
def test_inductor_failing_on_the_precompiled_route_falls_back_saying_why(
        plain_artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qkan_pack.runtime import _precompiled

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("inductor lowering failed")

    monkeypatch.setattr(_precompiled, "compile_graph", fail)
    with pytest.warns(UserWarning, match="no precompiled graphs: precompiled graphs failed: "
                                         "RuntimeError: inductor lowering failed"):
        predictor = Predictor.load(plain_artifact, compiled="on")
    assert predictor.report.compiled.startswith("inductor (mode default)"), predictor.report
    x = torch.randn(8, 2)
    with torch.no_grad():
        torch.testing.assert_close(predictor(x), _eager_twin(plain_artifact)(x))


def test_the_private_inductor_directory_imports_no_inductor() -> None:
    """A load of AOTInductor forms runs inside the private inductor directory: entering and
    leaving it must not import inductor (and with it dynamo), which the forms avoid."""
    code = ("import sys\nfrom qkan_pack.runtime._compiled import _private_inductor_dir\n"
            "with _private_inductor_dir():\n    pass\n"
            "print(sorted(m for m in ('torch._inductor', 'torch._dynamo') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_warms_exporter_writes_and_reads_back_forms_or_a_refusal(tmp_path: Path) -> None:
    forms = PrecompiledExport(tmp_path / "forms")
    assert forms.read() == ({}, None)  # nothing written yet
    forms.write_forms(b'{"plan": 1}', {"0.bin": b"graph", "autotune/ab/k.best_config": b"{}"})
    assert forms.read() == ({"0.bin": b"graph", "autotune/ab/k.best_config": b"{}",
                             "plan.json": b'{"plan": 1}'}, None)
    refused = PrecompiledExport(tmp_path / "refused")
    refused.write_refusal("dynamo cannot capture the whole forward")
    assert refused.read() == ({}, "dynamo cannot capture the whole forward")
    none = PrecompiledExport(None)
    none.write_forms(b"{}", {"0.bin": b"graph"})
    none.write_refusal("ignored")
    assert not none.makes_forms and none.read() == ({}, None)


def test_an_exporter_that_makes_no_forms_skips_the_precompiled_route(
        plain_artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """warm's fallback after its probe refused the forms: the load makes none, saying why,
    and goes on to torch.compile (refused here too, so the eager model serves)."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("dynamo cannot trace this")

    monkeypatch.setattr(torch, "compile", refuse)
    with pytest.warns(UserWarning, match="no precompiled graphs: warm's fresh-process probe "
                                         "refused them"):
        predictor = Predictor.load(plain_artifact, compiled="on", export=PrecompiledExport(None))
    assert predictor.report.compiled.startswith("off (torch.compile failed")


def test_a_refused_precompile_is_told_to_warms_exporter(
        plain_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qkan_pack.errors import PrecompileRefusedError

    def refuse(*args: object, **kwargs: object) -> None:
        raise PrecompileRefusedError("the graph reads a tensor the plan cannot name")

    monkeypatch.setattr(_compiled, "precompile", refuse)
    monkeypatch.setattr(torch, "compile", refuse)
    export = PrecompiledExport(tmp_path / "forms")
    with pytest.warns(UserWarning, match="no precompiled graphs: the graph reads a tensor"):
        Predictor.load(plain_artifact, compiled="on", export=export)
    assert export.read() == ({}, "the graph reads a tensor the plan cannot name")


@pytest.mark.slow
def test_warms_exporter_receives_the_forms_a_compiled_load_made(plain_artifact: Path,
                                                               tmp_path: Path) -> None:
    export = PrecompiledExport(tmp_path / "forms")
    predictor = Predictor.load(plain_artifact, compiled="on", export=export)
    assert predictor.report.compiled == ("precompiled: 2 graph(s) traced and compiled "
                                         "here; run by inductor's Python")
    forms, refused = export.read()
    assert refused is None and {"plan.json", "0.bin", "1.bin"} <= set(forms), sorted(forms)
    assert [shape.label for shape in Plan.from_json(forms["plan.json"]).shapes] == ["1x2", "8x2"]
