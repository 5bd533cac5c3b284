"""Real-world models built on the CPU and loaded on a GPU (``pytest -m gpu``).

For each: no false refusal (TF32 convolutions and cuDNN's choices differ from the CPU's
float32 by ~1e-3, which the reference self-test must tell from a wrong model), the predictor
equals eager PyTorch on the same device, and the same artifact re-signed after a small
weight edit (the head scaled by 1.01, one channel of the stem zeroed) is refused whenever
the edit moves the reference outputs by more than twice a shape's bound (each shape's is
set by its float32 rounding noise, measured at build). An edit that moves them by less
than half of it is below what outputs can show: pinning and signing cover it.
With QKAN_PACK_RESULTS=DIR the table of measured errors is written to DIR/zoo.{json,md}.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from qkan_pack import Predictor, SelfTestError, build
from qkan_pack.builder import write_artifact
from qkan_pack.format import WEIGHTS_NAME
from qkan_pack.runtime import (
    flatten,
    full_float32,
    read_artifact,
    rebuild_model,
    reference_samples,
)
from qkan_pack.runtime._report import _bound_text

from ..conftest import MODELS

pytestmark = pytest.mark.gpu
IMAGE = [(1, 3, 224, 224), (2, 3, 224, 224)]
TOKENS = [{"input_ids": (b, 16), "attention_mask": (b, 16)} for b in (1, 2)]
ZOO: dict[str, tuple[Path, Any, dict[str, Any], Any]] = {
    "torchvision resnet18": (MODELS / "zoo.py", IMAGE, {"name": "resnet18"}, "float32"),
    "torchvision resnet50": (MODELS / "zoo.py", IMAGE, {"name": "resnet50"}, "float32"),
    "torchvision efficientnet_b0": (MODELS / "zoo.py", IMAGE, {"name": "efficientnet_b0"},
                                    "float32"),
    "timm vit_tiny_patch16_224": (MODELS / "zoo.py", IMAGE,
                                  {"family": "timm", "name": "vit_tiny_patch16_224"}, "float32"),
    "timm convnext_atto": (MODELS / "zoo.py", IMAGE, {"family": "timm", "name": "convnext_atto"},
                           "float32"),
    "transformers bert": (MODELS / "hf_models.py", TOKENS, {"arch": "bert"}, "int64"),
    "transformers gpt2": (MODELS / "hf_models.py", TOKENS, {"arch": "gpt2"}, "int64"),
}
ROWS: list[dict[str, Any]] = []


@pytest.fixture(scope="module", autouse=True)
def table() -> Any:
    yield
    out = os.environ.get("QKAN_PACK_RESULTS")
    if out and ROWS:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "zoo.json").write_text(json.dumps(ROWS, indent=2) + "\n")
        (Path(out) / "zoo.md").write_text(_markdown(ROWS))


def _markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | artifact | max abs vs build reference | max rel | tolerance (rtol, atol) "
             "| verdict |", "|---|---|---:|---:|---|---|"]
    for row in rows:
        lines.append(f"| {row['model']} | {row['case']} | {row['max_abs']:.3g} | "
                     f"{row['max_rel']:.3g} | {row['tolerance']} | {row['verdict']} |")
    return "\n".join(lines) + "\n"


def _errors(got: list[torch.Tensor], want: list[torch.Tensor]) -> tuple[float, float]:
    worst_abs, worst_rel = 0.0, 0.0
    for a, b in zip(got, want):
        diff = (a.detach().double().cpu() - b.detach().double().cpu()).abs()
        worst_abs = max(worst_abs, float(diff.max()))
        worst_rel = max(worst_rel, float(diff.max() / b.detach().double().cpu().abs().max()))
    return worst_abs, worst_rel


def _edited(path: Path, out: Path, edit: str) -> Path:
    """A copy of the artifact whose first conv/linear weight is edited, re-signed (every
    digest recomputed): only the self-test can refuse it."""
    artifact = read_artifact(path)
    tensors = load_safetensors(artifact.files[WEIGHTS_NAME])
    # the model's first matrix/filter bank (its stem) loses a channel; its last (the head)
    # is scaled: edits every architecture feels (a block behind timm's 1e-6 layer scale
    # would not be: its effect stays below float32 noise, which no output check can see)
    order = list(rebuild_model(artifact, torch.device("cpu"),
                               dict(artifact.manifest.model.config)).state_dict())
    weights = [n for n in order if n in tensors and tensors[n].ndim >= 2 and "embed" not in n
               and not n.startswith(("transformer.wte", "transformer.wpe"))
               and not n.endswith(("_token", "pos_embed"))]
    name = weights[-1] if edit == "scaled x1.01" else weights[0]
    tensor = tensors[name].clone()
    if edit == "scaled x1.01":
        tensor *= 1.01
    else:
        tensor[0] = 0
    files = {**artifact.files, WEIGHTS_NAME: save_safetensors({**tensors, name: tensor},
                                                              metadata={"format": "pt"})}
    write_artifact(out, artifact.manifest, files)
    return out


@pytest.mark.parametrize("model", sorted(ZOO))
def test_zoo_model_loads_equals_eager_and_refuses_edits(model: str, tmp_path: Path) -> None:
    source, shapes, config, dtype = ZOO[model]
    path = build(source, shapes, output=tmp_path / "artifact", config=config, dtype=dtype).path
    device = torch.device("cuda")
    with Predictor.load(path, device="cuda") as predictor:  # no false refusal
        report = predictor.report
        bounds = [record.reference_tolerance for record in report.shapes]
        artifact = read_artifact(path)
        eager = rebuild_model(artifact, device, report.config)
        samples, expected = reference_samples(artifact, device)
        names = artifact.manifest.input_names
        for (label, inputs), want_ref, bound in zip(samples, expected, bounds, strict=True):
            call = _caller(eager, names, predictor.manifest.call)
            with torch.no_grad(), full_float32(device):  # what the self-test compares
                checked = _leaves(call(inputs))
            with torch.no_grad():  # this device's default math (TF32 convolutions)
                served = _leaves(call(inputs))
            for case, got, tolerance, verdict in (
                    ("full float32 (the self-test)", checked, _bound_text(bound), "accepted"),
                    ("default math, TF32 (not checked)", served, "-", "information")):
                max_abs, max_rel = _errors(got, want_ref)
                ROWS.append({"model": model, "case": f"sound {label}, {case}", "max_abs": max_abs,
                             "max_rel": max_rel, "tolerance": tolerance, "verdict": verdict})
            replayed = _leaves(predictor(**dict(zip(names, inputs))))
            assert _errors(replayed, served)[0] <= 1e-4, (model, label)
    for edit in ("scaled x1.01", "channel 0 zeroed"):
        edited = _edited(path, tmp_path / edit.replace(" ", "_"), edit)
        artifact = read_artifact(edited)
        wrong = _caller(rebuild_model(artifact, device, report.config), names, artifact.manifest.call)
        errors = [_errors(_leaves(_full_float32(wrong, inputs, device)), want_ref)
                  for (_, inputs), want_ref in zip(samples, expected)]
        effect = max(e[1] for e in errors)
        row = {"model": model, "case": f"re-signed, {edit}", "max_abs": max(e[0] for e in errors),
               "max_rel": effect, "tolerance": ", ".join(map(_bound_text, bounds))}
        ROWS.append(row)
        try:
            Predictor.load(edited, device="cuda").close()
            row["verdict"] = "accepted (effect under the bound: pin the digest or sign)"
        except SelfTestError:
            row["verdict"] = "refused"
        # a shape's bound is rtol * |ref| + atol * scale: at most (rtol + atol) x scale
        if any(e[1] > 2 * sum(b) for e, b in zip(errors, bounds)):  # an edit the outputs
            assert row["verdict"] == "refused", row  # show must be refused ...
        if all(e[1] < b[1] / 2 for e, b in zip(errors, bounds)):  # ... one they do not
            assert row["verdict"] != "refused", row  # show cannot be (float32 noise)



def _leaves(output: Any) -> list[torch.Tensor]:
    return flatten(output)


def _full_float32(call: Any, inputs: list[torch.Tensor], device: torch.device) -> Any:
    with torch.no_grad(), full_float32(device):
        return call(inputs)


def _caller(model: torch.nn.Module, names: tuple[str, ...], call: str) -> Any:
    if call == "keyword":
        return lambda inputs: model(**dict(zip(names, inputs)))
    return lambda inputs: model(*inputs)
