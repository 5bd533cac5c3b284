"""Does torch.compile(mode="reduce-overhead") of a flash-solver QKAN survive on its own, and
next to a loaded Predictor? (Diagnostic for the in-process benchmark's illegal memory access.)

    PYTHONPATH=. python benchmarks/diagnose_torch_compile.py [--with-predictor]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from qkan_pack import Predictor, build
from qkan_pack.artifact import read_artifact
from qkan_pack.loading import rebuild_model

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--with-predictor", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mlp"
        build(ROOT / "examples" / "qkan_mlp.py", "1x2,64x2", output=path)
        predictor = Predictor.load(path, device="cuda") if args.with_predictor else None
        artifact = read_artifact(path)
        model = rebuild_model(artifact, torch.device("cuda"), dict(artifact.manifest.model.config))
        compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
        for shape in [(1, 2), (64, 2), (1, 2)]:
            x = torch.randn(shape, device="cuda")
            for _ in range(20):
                with torch.no_grad():
                    got = compiled(x).clone()
                torch.cuda.synchronize()
            with torch.no_grad():
                want = model(x)
            error = (got - want).abs().max().item()
            print(f"shape {shape}: torch.compile vs eager max abs {error:.2e}", flush=True)
            if predictor is not None:
                print(f"  predictor vs eager {(predictor(x) - want).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
