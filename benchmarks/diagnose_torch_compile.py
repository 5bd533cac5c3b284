"""Which step of ``qkan-pack bench`` made in-process torch.compile(reduce-overhead) crash?

On an H200 (torch 2.11, triton 3.6) the torch.compile variant hit an illegal memory access
when it ran inside the bench process. This bisects: every configuration runs the real bench
(torch compile in process, few iterations), or a plain sequence of calls, in a fresh
subprocess, and reports whether the CUDA context survived.

Finding (benchmarks/results/2026-12-02-h200-torch-compile-*.txt): any predictor call after
torch.compile recorded a graph faulted inside the predictor's replay. torch.compile's CUDA
graph trees clear torch's cached cuBLAS workspaces around each recording; the predictor's
graphs had baked in a workspace allocated eagerly at warm-up, in the general pool, which was
then released. Captures now get their workspace inside the capture, in their own pool
(``qkan_pack.capture.private_cublas_workspace``), and the sequences pass.

    PYTHONPATH=. python benchmarks/diagnose_torch_compile.py [--configs a,b] [--blocking]

Steps that can be turned off: ``memory`` (the shared-vs-private pool measurement, which
captures and frees graphs and empties the allocator cache), ``bare`` (the bare replay variant),
``floor`` (the sleep-kernel GPU floor), ``qkan`` (qkan.compile_inference). ``tc_first`` warms
torch.compile on every shape before any other step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS: dict[str, dict[str, bool]] = {
    "tc_only": {"memory": False, "bare": False, "floor": False, "qkan": False},
    "memory": {"memory": True, "bare": False, "floor": False, "qkan": False},
    "bare_no_floor": {"memory": False, "bare": True, "floor": False, "qkan": False},
    "bare_floor": {"memory": False, "bare": True, "floor": True, "qkan": False},
    "qkan": {"memory": False, "bare": False, "floor": False, "qkan": True},
    "full": {"memory": True, "bare": True, "floor": True, "qkan": True},
    "full_tc_first": {"memory": True, "bare": True, "floor": True, "qkan": True, "tc_first": True},
}


def child(path: str, steps: dict[str, bool]) -> None:
    """One bench run in this process with the given steps; prints a JSON verdict line."""
    import torch

    from qkan_pack import bench

    if not steps.get("memory"):
        bench._Session._memory = lambda self, notes: {}
    if not steps.get("floor"):
        bench._Session._kernel_floor = lambda self, index, bare, result: None
    if steps.get("tc_first"):
        original = bench._Session.run

        def run_tc_first(self: bench._Session, show_progress: bool | None) -> bench.BenchReport:
            self._compiled = torch.compile(self._rebuild(), mode="reduce-overhead", dynamic=False)
            self._used_dynamo = True
            for _, inputs in self.samples:
                for _ in range(5):
                    self._compiled(*inputs)
            torch.cuda.synchronize()
            return original(self, show_progress)

        bench._Session.run = run_tc_first
    skip = [name for name, on in (("bare_graph", steps.get("bare")),
                                  ("qkan_compile_inference", steps.get("qkan"))) if not on]
    settings = bench.BenchSettings(iters=60, repeats=1, warmup=5, kernel_replays=20,
                                   skip=tuple(skip))
    report = bench.run_bench(path, "cuda", settings=settings, show_progress=False)
    verdict = {}
    for shape in report.shapes:
        item = shape.variants["torch_compile"]
        verdict[shape.label] = {"status": item.status, "reason": item.reason[:300],
                                "median_us": item.median_us,
                                "max_abs_diff": item.max_abs_diff_vs_eager}
    print("VERDICT " + json.dumps(verdict), flush=True)


def sequence(path: str, steps: str) -> None:
    """Run a sequence like ``E0 T0 P1 T1`` (E eager, P predictor, T torch.compile; digit: the
    manifest shape), synchronizing after each step, and say which step broke the context."""
    import torch

    from qkan_pack import Predictor
    from qkan_pack.artifact import read_artifact
    from qkan_pack.loading import rebuild_model, reference_samples

    device = torch.device("cuda")
    predictor = Predictor.load(path, device=device, progress=False)
    artifact = read_artifact(path)
    config = dict(artifact.manifest.model.config)
    eager = rebuild_model(artifact, device, config)
    compiled = torch.compile(rebuild_model(artifact, device, config), mode="reduce-overhead",
                             dynamic=False)
    samples = [inputs for _, inputs in reference_samples(artifact, device)[0]]
    calls = {"E": eager, "P": predictor, "T": compiled}
    with torch.no_grad():
        for step in steps.split():
            inputs = samples[int(step[1:])]
            for _ in range(6):
                calls[step[0]](*inputs)
            torch.cuda.synchronize()
            print(f"step {step}: ok", flush=True)
    print("VERDICT " + json.dumps({"sequence": steps, "status": "ok"}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--blocking", action="store_true", help="CUDA_LAUNCH_BLOCKING=1 too")
    parser.add_argument("--example", default="qkan_mlp.py")
    parser.add_argument("--shapes", default="1x2,64x2")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--sequences", default="",
                        help="';'-separated step sequences instead of bench configs, e.g. 'T0 T1;E0 T0'")
    parser.add_argument("--logs", help="directory for every child's whole output")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "PATH", "ARG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, path, arg = args.child
        child(path, json.loads(arg)) if mode == "bench" else sequence(path, arg)
        return 0
    from qkan_pack import build

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model"
        build(ROOT / "examples" / args.example, args.shapes, output=path, progress_bar=False)
        if args.sequences:
            jobs = {seq: ("sequence", seq) for seq in args.sequences.split(";")}
        else:
            jobs = {name: ("bench", json.dumps(CONFIGS[name])) for name in args.configs.split(",")}
        runs = [(name, False) for name in jobs]
        if args.blocking:
            runs += [(name, True) for name in jobs]
        for number, (name, blocking) in enumerate(runs):
            env = dict(os.environ, QKAN_PACK_DEBUG="1")
            if blocking:
                env["CUDA_LAUNCH_BLOCKING"] = "1"
            label = name + (" (CUDA_LAUNCH_BLOCKING=1)" if blocking else "")
            started = time.perf_counter()
            try:
                done = subprocess.run([sys.executable, __file__, "--child", jobs[name][0],
                                       str(path), jobs[name][1]], env=env, capture_output=True,
                                      text=True, timeout=args.timeout)
                code, text = done.returncode, done.stdout + done.stderr
            except subprocess.TimeoutExpired as exc:
                code, text = "timeout", f"{exc.stdout or ''}{exc.stderr or ''}"
            seconds = time.perf_counter() - started
            if args.logs:
                Path(args.logs).mkdir(parents=True, exist_ok=True)
                Path(args.logs, f"{number:02d}.txt").write_text(f"{label}\n{text}")
            verdict = next((line[8:] for line in text.splitlines() if line.startswith("VERDICT ")),
                           None)
            results[label] = {"exit": code, "seconds": round(seconds, 1), "verdict": verdict}
            print(f"== {label}: exit {code} in {seconds:.1f}s; torch.compile: {verdict}", flush=True)
            if verdict is None or "failed" in verdict:
                tail = [line for line in text.splitlines() if "Warning" not in line][-40:]
                print("\n".join("   | " + line for line in tail), flush=True)
    print("SUMMARY " + json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
