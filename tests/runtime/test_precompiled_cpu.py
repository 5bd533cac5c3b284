"""Precompiled graphs without a GPU: what the plan names (inputs, parameters, buffers, plain
tensor attributes, outputs), what is refused and why (a graph break, a changed model, an
unreadable plan, another torch), and (slow: inductor's CPU backend compiles C++) forms made
in one process loaded in a fresh one, equal to eager, and a graph break served by
torch.compile instead."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from qkan_pack import ManifestError, Predictor, build
from qkan_pack.runtime import _precompiled
from qkan_pack.runtime._calling import bind_forward
from qkan_pack.runtime._precompiled import (
    AOTI_ENV,
    Plan,
    PrecompileRefusedError,
    autotune_results,
    compile_graph,
    load_precompiled,
    makes_aoti,
    precompile,
    resolve,
    restore_autotune,
    trace_graph,
)

from ..conftest import ROOT


class Cached(nn.Module):
    """A parameter, a buffer and a plain tensor attribute (as QKAN keeps its solver caches),
    named inputs, and a dict output."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.register_buffer("shift", torch.linspace(0, 1, width))
        self.cache = torch.arange(width, dtype=torch.float32) / 10

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"sum": self.linear(x) + self.shift * self.cache, "y": torch.relu(y) * 2}


class Breaks(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2


def _inputs(batch: int = 2, width: int = 4) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(batch)
    return [torch.randn(batch, width, generator=generator), torch.randn(batch, 3, generator=generator)]


def test_the_plan_names_every_graph_input_and_output_leaf() -> None:
    model = Cached().eval()
    forward = bind_forward(model, ["x", "y"], "keyword")
    _, example, plan = trace_graph(model, forward, _inputs())
    kinds = {(ref.kind, ref.name) for ref in plan.args}
    assert {("input", "0"), ("input", "1"), ("state", "linear.weight"), ("state", "linear.bias"),
            ("state", "shift"), ("attr", ":cache")} == kinds
    assert len(example) == len(plan.args)
    assert [ref.shape for ref in plan.inputs] == [(2, 4), (2, 3)]
    assert len(plan.outputs) == 2 and len(set(plan.outputs)) == 2
    for ref in plan.args:
        if ref.kind != "input":
            assert resolve(model, ref).shape == ref.shape


def test_a_graph_break_has_no_precompiled_form() -> None:
    with pytest.raises(PrecompileRefusedError, match="cannot capture the whole forward in one graph"):
        trace_graph(Breaks(), Breaks(), [torch.ones(2)])


def test_a_changed_model_is_refused_naming_the_tensor() -> None:
    model = Cached(4)
    _, _, plan = trace_graph(model, bind_forward(model, ["x", "y"], "keyword"), _inputs())
    weight = next(ref for ref in plan.args if ref.name == "linear.weight")
    with pytest.raises(PrecompileRefusedError, match=r"'linear.weight' is \(5, 5\) float32 here, but "
                                                r"the precompiled graph was made for \(4, 4\)"):
        resolve(Cached(5), weight)
    gone = dataclasses.replace(weight, name="linear.missing")
    with pytest.raises(PrecompileRefusedError, match=r"has no state 'linear\.missing'"):
        resolve(Cached(4), gone)


def test_an_unreadable_plan_or_another_torch_config_or_device_is_refused() -> None:
    with pytest.raises(PrecompileRefusedError, match="plan is unreadable"):
        Plan.from_json(b'{"schema": "something else"}')
    with pytest.raises(PrecompileRefusedError, match="plan is unreadable"):
        Plan.from_json(b"not json")
    cpu = torch.device("cpu")
    other = Plan(torch="0.0.1", device="cpu", config={}, shapes=()).to_json()
    with pytest.raises(PrecompileRefusedError, match=r"made with torch 0\.0\.1"):
        load_precompiled(Cached(), other, {}, [], cpu, {})
    mine = Plan(torch=torch.__version__, device="cpu", config={}, shapes=()).to_json()
    with pytest.raises(PrecompileRefusedError, match=r"made for shapes \[\], the manifest declares"):
        load_precompiled(Cached(), mine, {}, ["2x4"], cpu, {})
    elsewhere = Plan(torch=torch.__version__, device="cuda:0", config={}, shapes=()).to_json()
    with pytest.raises(PrecompileRefusedError, match=r"compiled for cuda:0 .* loading on cuda:1: "
                                                r"warm with --device cuda:1"):
        load_precompiled(Cached(), elsewhere, {}, [], torch.device("cuda:1"), {})
    flash = Plan(torch=torch.__version__, device="cpu", config={"solver": "flash"},
                 shapes=()).to_json()
    with pytest.raises(PrecompileRefusedError, match=r'traced with config \{"solver": "flash"\}, this '
                                                r'load\'s is \{"solver": "exact"\}'):
        load_precompiled(Cached(), flash, {}, [], cpu, {"solver": "exact"})


def _plan_with(**change: object) -> bytes:
    shape = {"label": "2x4", "file": "0.bin",
             "inputs": [{"kind": "input", "name": "0", "shape": [2, 4], "dtype": "float32"}],
             "args": [{"kind": "input", "name": "0", "shape": [2, 4], "dtype": "float32"},
                      {"kind": "state", "name": "w", "shape": [4, 4], "dtype": "float32"}],
             "outputs": [0]}
    shape.update(change)
    return json.dumps({"schema": "qkan-pack-precompiled/1", "torch": "2.13.0", "device": "cpu",
                       "config": {}, "shapes": [shape]}).encode()


@pytest.mark.parametrize("change", [
    {"outputs": [-1]}, {"outputs": [0.5]}, {"outputs": [True]},
    {"args": [{"kind": "python", "name": "x", "shape": [1], "dtype": "float32"}]},
    {"args": [{"kind": "input", "name": "3", "shape": [2, 4], "dtype": "float32"}]},
    {"args": [{"kind": "input", "name": "zero", "shape": [2, 4], "dtype": "float32"}]},
    {"args": [{"kind": "state", "name": "w", "shape": "44", "dtype": "float32"}]},
    {"inputs": [{"kind": "state", "name": "0", "shape": [2, 4], "dtype": "float32"}]},
    {"inputs": [{"kind": "input", "name": "1", "shape": [2, 4], "dtype": "float32"}]},
    {"label": 7},
    {"form": "tensorrt"}, {"form": "aoti", "aoti_refused": 3},
], ids=lambda change: next(iter(change)) + ":" + json.dumps(next(iter(change.values())))[:40])
def test_a_malformed_plan_is_refused_before_anything_loads(change: dict) -> None:
    assert Plan.from_json(_plan_with()).shapes[0].outputs == (0,)
    with pytest.raises(PrecompileRefusedError, match="plan is unreadable"):
        Plan.from_json(_plan_with(**change))


@pytest.mark.parametrize(("change", "where"), [
    ({"outputs": [0, -1]}, "plan.shapes[0].outputs[1]"),
    ({"extra": 1}, "plan.shapes[0].extra"),
    ({"args": [{"kind": "input", "name": "3", "shape": [2, 4], "dtype": "float32"}]},
     "plan.shapes[0].args[0].name"),
    ({"inputs": [{"kind": "input", "name": "0", "shape": [2, "4"], "dtype": "float32"}]},
     "plan.shapes[0].inputs[0].shape[1]"),
])
def test_a_refused_plan_names_the_json_path(change: dict, where: str) -> None:
    """The plan is read by the manifest's reader: the refusal's cause names the path, and a
    key the plan's schema does not define is refused as in the manifest."""
    with pytest.raises(PrecompileRefusedError, match=re.escape(f"plan is unreadable ({where} ")) as info:
        Plan.from_json(_plan_with(**change))
    assert isinstance(info.value.__cause__, ManifestError)
    assert info.value.__cause__.where == where


def test_a_plan_round_trips_through_its_json() -> None:
    plan = Plan.from_json(_plan_with())
    assert Plan.from_json(plan.to_json()) == plan
    assert json.loads(plan.to_json()) == json.loads(_plan_with())


def test_a_plan_without_forms_holds_inductors_and_a_form_round_trips() -> None:
    """Plans written before forms existed read as inductor's form, and the plan written for
    one leaves the keys out (an older reader still reads it)."""
    old = Plan.from_json(_plan_with())
    assert (old.shapes[0].form, old.shapes[0].aoti_refused) == ("inductor", "")
    assert "form" not in old.to_json().decode()
    aoti = Plan.from_json(_plan_with(form="aoti", file="0.pt2"))
    assert aoti.shapes[0].form == "aoti"
    assert Plan.from_json(aoti.to_json()) == aoti


def test_the_report_says_which_forms_run_and_why_inductors_python_runs() -> None:
    def plan(*shapes: tuple[str, str]) -> Plan:
        base = Plan.from_json(_plan_with()).shapes[0]
        return Plan(torch="2.13.0", device="cuda:0", config={}, shapes=tuple(
            dataclasses.replace(base, label=f"{i}x4", form=form, aoti_refused=why)
            for i, (form, why) in enumerate(shapes, 1)))

    assert plan(("aoti", ""), ("aoti", "")).describe_forms() == \
        "AOTInductor packages run by torch's C++ loader"
    assert plan(("inductor", "")).describe_forms() == "run by inductor's Python"
    assert plan(("aoti", ""), ("inductor", "Unsupported: data-dependent")).describe_forms() == \
        ("1 AOTInductor, 1 run by inductor's Python (AOTInductor refused 2x4: Unsupported: "
         "data-dependent)")


def test_aoti_forms_are_made_for_gpu_targets_unless_turned_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert makes_aoti(torch.device("cuda:0")) and not makes_aoti(torch.device("cpu"))
    monkeypatch.setenv(AOTI_ENV, "0")
    assert not makes_aoti(torch.device("cuda:0"))


def test_a_graph_aotinductor_refuses_gets_inductors_form_saying_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> bytes:
        raise RuntimeError("Unsupported: a data-dependent branch")

    monkeypatch.setattr(_precompiled, "makes_aoti", lambda device: True)
    monkeypatch.setattr(_precompiled, "compile_aoti", refuse)
    monkeypatch.setattr(_precompiled, "compile_inductor", lambda gm, example: b"inductor's")
    monkeypatch.setattr(_precompiled, "_callable", lambda data: ("loaded", data))
    made = compile_graph(torch.fx.symbolic_trace(nn.ReLU()), [torch.ones(1)], "cuda:0")
    assert (made.form, made.data, made.call) == ("inductor", b"inductor's", ("loaded", b"inductor's"))
    assert made.aoti_refused.startswith("RuntimeError: Unsupported: a data-dependent branch")


def test_an_unloadable_aoti_package_is_refused_saying_why() -> None:
    """Refused before torch's loader opens it (``_aoti.check_package``; its other refusals
    are tested in test_aoti_cpu.py)."""
    shape = dataclasses.replace(Plan.from_json(_plan_with()).shapes[0], form="aoti")
    with pytest.raises(PrecompileRefusedError, match=r"the AOTInductor package cannot be read "
                                                     r"\(BadZipFile: "):
        _precompiled.load_graph(shape, b"not a package", "cpu")




@pytest.mark.slow
def test_aoti_forms_load_in_a_fresh_process_without_inductors_python(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The AOTInductor route on the CPU (made for GPU targets; the same export, package,
    C++ loader and call): a fresh process loads and runs it without importing dynamo,
    inductor, sympy's shape machinery or networkx."""
    monkeypatch.setattr(_precompiled, "makes_aoti", lambda device: True)
    torch.manual_seed(0)
    model = Cached().eval()
    samples = [("2x4", _inputs(2))]
    plan, files, made = precompile(model, bind_forward(model, ["x", "y"], "keyword"), samples,
                                   {"width": 4}, torch.device("cpu"))
    assert [(shape.form, shape.file) for shape in plan.shapes] == [("aoti", "0.pt2")]
    with torch.no_grad():
        eager = model(*samples[0][1])
    for got, want in zip(made(*samples[0][1]), eager.values()):
        torch.testing.assert_close(got, want)
    seen = _fresh_load(tmp_path, plan, files, {})
    assert seen == {"worst": seen["worst"], "traced": 0, "before": [], "imported": []}
    assert seen["worst"] < 1e-6


#: A fresh process loads the forms in argv[1] for the shapes argv[3:] (batches of ``_inputs``)
#: and says how far they are from eager, how many graphs dynamo traced, and which of the
#: modules compiled mode's start pays for were imported (before the load and after).
FRESH = """
import json, sys
import torch
sys.path.insert(0, sys.argv[2])
from tests.runtime.test_precompiled_cpu import Cached, _inputs
from qkan_pack.runtime._precompiled import load_precompiled
from pathlib import Path
folder, labels = Path(sys.argv[1]), sys.argv[3:]
heavy = ("torch._dynamo", "torch._inductor", "torch.fx.experimental.symbolic_shapes", "networkx")
before = [name for name in heavy if name in sys.modules]
torch.manual_seed(0)
model = Cached().eval()
files = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "plan.json"}
forward = load_precompiled(model, (folder / "plan.json").read_bytes(), files, labels,
                           torch.device("cpu"), {"width": 4})
worst = 0.0
for label in labels:
    inputs = _inputs(int(label.split("x")[0]))
    with torch.no_grad():
        eager = model(*inputs)
    got = forward(*inputs)
    worst = max(worst, *(float((g - e).abs().max()) for g, e in zip(got, eager.values())))
imported = [name for name in heavy if name in sys.modules]
dynamo = sys.modules.get("torch._dynamo.utils")
traced = int(dynamo.counters["stats"]["unique_graphs"]) if dynamo else 0
print(json.dumps({"worst": worst, "traced": traced, "before": before, "imported": imported}))
"""


def _fresh_load(folder: Path, plan: Plan, files: dict[str, bytes], env: dict[str, str]) -> dict:
    """``FRESH``'s answer for these forms, written into ``folder``."""
    (folder / "plan.json").write_bytes(plan.to_json())
    for name, data in files.items():
        (folder / name).write_bytes(data)
    done = subprocess.run([sys.executable, "-c", FRESH, str(folder), str(ROOT),
                           *(shape.label for shape in plan.shapes)],
                          capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_forms_made_here_load_in_a_fresh_process_without_tracing(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Cached().eval()
    samples = [("1x4", _inputs(1)), ("3x4", _inputs(3))]
    plan, files, made = precompile(model, bind_forward(model, ["x", "y"], "keyword"), samples,
                                   {"width": 4}, torch.device("cpu"))
    for _, inputs in samples:
        with torch.no_grad():
            eager = model(*inputs)
        for got, want in zip(made(*inputs), eager.values()):
            torch.testing.assert_close(got, want)
    seen = _fresh_load(tmp_path, plan, files,
                       {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert (seen["traced"], seen["before"]) == (0, [])
    assert "torch._inductor" in seen["imported"]  # inductor's form runs through its Python
    assert seen["worst"] < 1e-6


@pytest.mark.slow
def test_a_graph_break_is_served_by_torch_compile_saying_why(tmp_path: Path) -> None:
    model_file = tmp_path / "breaks.py"
    model_file.write_text(
        "import torch\nfrom torch import nn\n\n\nclass Breaks(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.linear = nn.Linear(3, 3)\n\n"
        "    def forward(self, x):\n        x = self.linear(x)\n        torch._dynamo.graph_break()\n"
        "        return x * 2\n\n\ndef build_model():\n    torch.manual_seed(0)\n    return Breaks()\n")
    path = build(model_file, "2x3", output=tmp_path / "art").path
    with pytest.warns(UserWarning, match="no precompiled graphs: dynamo cannot capture the whole "
                                         "forward in one graph"):
        predictor = Predictor.load(path, compiled="on")
    assert predictor.report.compiled.startswith("inductor (mode default): 2 graph(s), 1 graph break")
    x = torch.randn(2, 3)
    with torch.no_grad():
        model = __import__("runpy").run_path(str(model_file))["build_model"]().eval()
        torch.testing.assert_close(predictor(x), model(x))


def test_autotuning_choices_round_trip_and_stay_inside_the_cache(tmp_path: Path) -> None:
    made = tmp_path / "made"
    (made / "ab").mkdir(parents=True)
    (made / "ab" / "k1.best_config").write_text('{"XBLOCK": 128}')
    (made / "ab" / "k1.py").write_text("not shipped")
    shipped = autotune_results(made)
    assert shipped == {"autotune/ab/k1.best_config": b'{"XBLOCK": 128}'}
    private = tmp_path / "private"
    assert restore_autotune({**shipped, "0.bin": b"graph"}, private) == 1
    assert (private / "ab" / "k1.best_config").read_text() == '{"XBLOCK": 128}'
    for bad in ("autotune/../escape.best_config", "autotune/ab/k1.py", "autotune//x.best_config"):
        with pytest.raises(PrecompileRefusedError, match="not a plain path inside the cache"):
            restore_autotune({bad: b"{}"}, private)
    assert not (tmp_path / "escape.best_config").exists()
