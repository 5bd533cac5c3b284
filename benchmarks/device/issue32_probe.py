"""Issue 32, item 10, on the GPU: reproduce each reported failure and record the figures the
fixes are designed from. Builds on this machine's CPU, loads on its GPU.

    python3 benchmarks/device/issue32_probe.py OUTDIR
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from qkan_pack import Predictor, build
from qkan_pack.runtime import compare

MODELS = Path(__file__).resolve().parents[2] / "tests" / "models"
RESULTS: dict[str, object] = {}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return compare([a.double().cpu()], [b.double().cpu()], (0.0, 0.0)).max_rel


def half_figures(dtype: str, kind: str, shape: tuple[int, ...]) -> dict[str, float]:
    """Build-host (CPU) and GPU rounding of a half-precision model, and a x1.01 head edit."""
    sys.path.insert(0, str(MODELS))
    import half_models

    model = half_models.build_model(dtype, kind).eval()
    torch.manual_seed(1)
    x = torch.randn(shape).to(getattr(torch, dtype))
    edited = copy.deepcopy(model)
    with torch.no_grad():
        list(edited.parameters())[-2].mul_(1.01)
    out = {}
    with torch.no_grad():
        ref = model(x)
        wide = copy.deepcopy(model).double()(x.double())
        out["cpu_noise"] = rel(ref, wide)
        cuda = copy.deepcopy(model).cuda()
        got = cuda(x.cuda())
        gpu_wide = copy.deepcopy(model).double().cuda()(x.double().cuda())
        out["gpu_vs_ref"] = rel(got, ref)
        out["gpu_noise"] = rel(got, gpu_wide)
        out["gpu_float64_vs_ref"] = rel(gpu_wide, ref)
        out["gpu_float64_vs_cpu_float64"] = rel(gpu_wide, wide)
        e_got = copy.deepcopy(edited).cuda()(x.cuda())
        e_wide = copy.deepcopy(edited).double().cuda()(x.double().cuda())
        out["edit_gpu_vs_ref"] = rel(e_got, ref)
        out["edit_gpu_float64_vs_ref"] = rel(e_wide, ref)
    return out


def attempt(name: str, model: str, shapes, **kwargs) -> None:
    """Build on the CPU, load on the GPU; record the outcome and the report."""
    entry: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            result = build(MODELS / model, shapes, output=Path(tmp) / "a", progress=False,
                           **kwargs)
            entry["build"] = "ok"
            entry["noise"] = [s.noise for s in result.manifest.shapes]
            entry["notes"] = list(result.notes)
        except Exception as exc:
            entry["build"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()
            RESULTS[name] = entry
            return
        try:
            predictor = Predictor.load(Path(tmp) / "a", device="cuda")
            entry["load"] = "ok"
            entry["report"] = str(predictor.report)
            predictor.close()
        except Exception as exc:
            entry["load"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()
    RESULTS[name] = entry
    print(name, json.dumps({k: v for k, v in entry.items() if k != "traceback"}, indent=1,
                           default=str)[:3000], flush=True)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for dtype in ("bfloat16", "float16"):
        for kind, shape in (("mlp", (8, 64)), ("cnn", (4, 3, 32, 32))):
            try:
                RESULTS[f"figures {dtype} {kind}"] = half_figures(dtype, kind, shape)
            except Exception:
                RESULTS[f"figures {dtype} {kind}"] = traceback.format_exc()
            print(dtype, kind, RESULTS[f"figures {dtype} {kind}"], flush=True)
            attempt(f"load {dtype} {kind}", "half_models.py",
                    [shape], dtype=dtype, config={"dtype": dtype, "kind": kind})
    attempt("load masked encoder", "masked_encoder.py",
            [{"x": (2, 16, 32), "mask": (2, 16)}], dtype={"x": "float32", "mask": "int64"})
    attempt("load fasterrcnn", "zoo.py", [(1, 3, 320, 320)],
            config={"family": "detection", "name": "fasterrcnn_mobilenet_v3_large_320_fpn"})
    (out / "issue32-probe.json").write_text(json.dumps(RESULTS, indent=1, default=str))


if __name__ == "__main__":
    main()
