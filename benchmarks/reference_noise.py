"""How much float32 rounding noise a sound model carries, and how far another device moves it.

For each model of the GPU zoo (``tests/runtime/test_gpu_zoo.py``), built on the CPU: the build
references' noise (CPU float32 against the model in float64), the CPU's own reassociation (1
thread against all), the cross-device difference the reference self-test sees (GPU in full
float32 against the CPU references), the GPU's noise (GPU float32 against CPU float64), and
what the zoo's two re-signed edits do. Each figure is ``compare``'s ``max_rel`` (largest
difference over the output's scale); the ratio cross-device / build noise is what
``runtime._selftest.NOISE_FACTOR`` must cover. Run from the repository root on a GPU host:

    OUT=results python3 benchmarks/reference_noise.py   # ONLY=bert to run a subset

Committed: ``benchmarks/results/2026-12-04_h200_reference-noise-measurements.json``, made on
the H200 by this script's first form (keys ``cpu32_vs_cpu64``, ``cpu32_vs_1thread``,
``gpu32_vs_cpu32``, ``gpu32_vs_cpu64``, ``gpu64_vs_cpu64``, ``edit_scale``, ``edit_zero``,
each ``[max_rel, norm-relative]``).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.getcwd())
from qkan_pack import build
from qkan_pack.runtime import (
    bind_forward,
    compare,
    flatten,
    full_float32,
    read_artifact,
    rebuild_model,
    reference_samples,
)
from tests.runtime.test_gpu_zoo import ZOO

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def share(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Largest difference over the output's scale, as the self-test measures it."""
    return compare([g.double() for g in got], [w.double() for w in want], (0.0, 0.0)).max_rel


def outputs(forward: Any, inputs: list[torch.Tensor], wide: bool = False) -> list[torch.Tensor]:
    if wide:
        inputs = [t.double() if t.is_floating_point() else t for t in inputs]
    with torch.no_grad():
        return flatten(forward(*inputs))


def edited(model: torch.nn.Module, edit: str) -> str:
    """The zoo's edits in place: the head scaled by 1.01, or the stem's channel 0 zeroed."""
    state = model.state_dict()
    weights = [n for n, t in state.items() if t.ndim >= 2 and "embed" not in n
               and not n.startswith(("transformer.wte", "transformer.wpe"))
               and not n.endswith(("_token", "pos_embed"))]
    name = weights[-1] if edit == "scale" else weights[0]
    with torch.no_grad():
        if edit == "scale":
            state[name].mul_(1.01)
        else:
            state[name][0] = 0
    return name


def measure(key: str, workdir: Path) -> list[dict[str, Any]]:
    source, shapes, config, dtype = ZOO[key]
    path = build(source, shapes, output=workdir / key.replace(" ", "_"), config=config,
                 dtype=dtype, force=True, progress=False).path
    artifact = read_artifact(path)
    names, call, cfg = artifact.manifest.input_names, artifact.manifest.call, artifact.manifest.model.config
    cpu = rebuild_model(artifact, torch.device("cpu"), dict(cfg))
    here = rebuild_model(artifact, DEVICE, dict(cfg))
    forwards = {
        "cpu": bind_forward(cpu, names, call),
        "cpu64": bind_forward(copy.deepcopy(cpu).double(), names, call),
        "here": bind_forward(here, names, call),
        "here64": bind_forward(copy.deepcopy(here).double(), names, call),
    }
    edits = {}
    for edit in ("scale", "zero"):
        model = copy.deepcopy(here)
        edits[edit] = (bind_forward(model, names, call), edited(model, edit))
    rows = []
    samples, expected = reference_samples(artifact, torch.device("cpu"))
    for (label, inputs), want in zip(samples, expected, strict=True):
        cpu64 = outputs(forwards["cpu64"], inputs, wide=True)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        one_thread = outputs(forwards["cpu"], inputs)
        torch.set_num_threads(threads)
        moved = [t.to(DEVICE) for t in inputs]
        with full_float32(DEVICE):
            here32 = outputs(forwards["here"], moved)
            edit_out = {e: outputs(f, moved) for e, (f, _) in edits.items()}
        rows.append({
            "model": key, "shape": label,
            "build_noise_cpu32_vs_cpu64": share(want, cpu64),
            "cpu_1_thread_vs_all": share(one_thread, want),
            "cross_device_gpu32_vs_cpu32": share(here32, want),
            "gpu_noise_gpu32_vs_cpu64": share(here32, cpu64),
            "gpu64_vs_cpu64": share(outputs(forwards["here64"], moved, wide=True), cpu64),
            "edit_scaled_x1.01": share(edit_out["scale"], want),
            "edit_channel_0_zeroed": share(edit_out["zero"], want),
            "edited_tensors": {e: name for e, (_, name) in edits.items()},
        })
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    out = Path(os.environ.get("OUT", "results"))
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(os.environ.get("WORKDIR", "/tmp/reference-noise"))
    only = os.environ.get("ONLY")
    rows = []
    for key in sorted(ZOO):
        if only and only not in key:
            continue
        started = time.time()
        rows += measure(key, workdir)
        print(f"{key}: {time.time() - started:.1f} s", flush=True)
    (out / "noise.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
