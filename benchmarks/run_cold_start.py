"""Issue-5 figure: cold start of a fresh process on an empty Triton cache, without and with
kernels shipped inside the artifact (`qkan-pack warm`).

    PYTHONPATH=. python benchmarks/run_cold_start.py OUT_DIR [--skip-torch-compile]

Model: QKAN([64,64,64], reps=3, solver="flash") with 8 shapes (batch 1..128). Each
measurement is a new interpreter with empty TRITON_CACHE_DIR/TORCHINDUCTOR_CACHE_DIR
(``qkan_pack.bench_cold``). Writes ``<date>_<gpu>_cold_start.json`` and ``.md`` to OUT_DIR.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from qkan_pack import build  # noqa: E402
from qkan_pack.bench_cold import run_cold_start  # noqa: E402
from qkan_pack.kernels import warm  # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
CONFIG = {"width": [64, 64, 64], "reps": 3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--skip-torch-compile", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda", 0)
    gpu = re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-")
    stem = f"{dt.date.today().isoformat()}_{gpu}_cold_start"
    results: dict[str, Any] = {"model": "QKAN([64,64,64], reps=3, solver=flash), 8 shapes",
                               "shapes": [f"{b}x64" for b in BATCHES], "gpu": gpu}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "qkan64x8"
        build(ROOT / "examples" / "qkan_mlp.py", ",".join(f"{b}x64" for b in BATCHES),
              output=path, config=CONFIG)
        results["without_shipped_kernels"] = run_cold_start(
            path, device, fresh_kernel_cache=True, skip_torch_compile=args.skip_torch_compile)
        shipped = warm(path, "cuda")
        results["warm"] = {"key": shipped.key, "files": shipped.files, "bytes": shipped.bytes}
        results["with_shipped_kernels"] = run_cold_start(
            path, device, fresh_kernel_cache=True, skip_torch_compile=True)
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=2, default=str))
    table = render(results)
    (args.out / f"{stem}.md").write_text(table + "\n")
    print(table)


def render(results: dict[str, Any]) -> str:
    before = results["without_shipped_kernels"]["predictor"]
    after = results["with_shipped_kernels"]["predictor"]
    names = list(dict.fromkeys([s for s, _ in before["stages"]] + [s for s, _ in after["stages"]]))
    first, second = dict(before["stages"]), dict(after["stages"])
    lines = [
        f"# Cold start, {results['model']}, fresh process, empty Triton cache ({results['gpu']})",
        "",
        "| stage | compiled at load (s) | shipped kernels (s) |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {n} | {first.get(n, 0.0):.3f} | {second.get(n, 0.0):.3f} |" for n in names]
    lines += [
        f"| **load-to-ready** (Predictor.load, imports excluded) | "
        f"**{before['load']['load_to_ready_s']:.3f}** | **{after['load']['load_to_ready_s']:.3f}** |",
        f"| launch to first result | {before['total_s']:.3f} | {after['total_s']:.3f} |",
        "",
        f"kernel cache: without: `{before['load']['kernel_cache']}`; "
        f"with: `{after['load']['kernel_cache']}`",
        f"shipped set: {results['warm']['key']}, {results['warm']['files']} files, "
        f"{results['warm']['bytes'] / 2**20:.2f} MiB",
    ]
    tc = results["without_shipped_kernels"].get("torch_compile")
    if tc and not tc.get("error"):
        lines.append(f"torch.compile(mode='reduce-overhead') first fast call after "
                     f"{tc.get('fast_total_s', float('nan')):.3f}s from launch "
                     f"({tc.get('calls_to_fast')} calls)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
