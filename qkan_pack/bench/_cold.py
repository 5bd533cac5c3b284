"""Cold start: a fresh process from launch to its first served call, stage by stage.

Each measurement is a new interpreter (``sys.executable -c``, this environment inherited)
running ``_cold_child.py``: once for ``Predictor.load`` + calls, once (CUDA only) for
``torch.compile(mode="reduce-overhead")`` until its calls reach steady-state latency.
``fresh_kernel_cache`` gives each process empty ``TRITON_CACHE_DIR`` and
``TORCHINDUCTOR_CACHE_DIR`` directories, as on a host that never compiled these kernels;
otherwise the caches of this environment are used as they are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..runtime import read_artifact

CHILD = Path(__file__).with_name("_cold_child.py")
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


def run_cold_start(path: str | Path, target: torch.device, *, fresh_kernel_cache: bool = False,
                   timeout: float = 600.0, config_overrides: Mapping[str, Any] | None = None,
                   skip_torch_compile: bool = False, calls: int = 30) -> dict[str, Any]:
    """Stage timings of fresh processes serving the first manifest shape from ``path``."""
    manifest = read_artifact(path).manifest
    result: dict[str, Any] = {
        "shape": manifest.shapes[0].label,
        "device": str(target),
        "kernel_cache": ("fresh (empty TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR per process)"
                         if fresh_kernel_cache else "inherited from this environment"),
        "calls": calls,
        "notes": [],
        "predictor": None,
        "torch_compile": None,
    }
    options = {"path": str(Path(path).resolve()), "device": str(target), "calls": calls,
               "overrides": dict(config_overrides or {})}
    result["predictor"] = _child("predictor", options, fresh_kernel_cache, timeout)
    if target.type != "cuda":
        result["notes"].append('torch.compile(mode="reduce-overhead") serves from CUDA graphs: '
                               "not measured without CUDA")
    elif skip_torch_compile:
        result["notes"].append("torch.compile skipped on request (--skip torch_compile)")
    else:
        result["torch_compile"] = _child("torch_compile", options, fresh_kernel_cache, timeout)
    return result


def _child(mode: str, options: dict[str, Any], fresh_kernel_cache: bool,
           timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="qkan-pack-cold-") as scratch:
        out = Path(scratch) / "result.json"
        env = _environment(Path(scratch), fresh_kernel_cache)
        args = {**options, "mode": mode, "out": str(out), "launched": time.time()}
        try:
            done = subprocess.run([sys.executable, "-c", CHILD.read_text(), json.dumps(args)],
                                  env=env, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired:
            return {"stages": [], "error": f"no first call within {timeout:.0f}s (timed out)"}
        record = _read(out)
        if done.returncode != 0 and not record.get("error"):
            record["error"] = f"exit status {done.returncode}: {_tail(done.stderr)}"
        record.setdefault("stages", [])
        record["wall_s"] = time.time() - args["launched"]
        return record


def _environment(scratch: Path, fresh_kernel_cache: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env["QKAN_PACK_PROGRESS"] = "0"
    if fresh_kernel_cache:
        for name in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
            directory = scratch / name.lower()
            directory.mkdir()
            env[name] = str(directory)
    return env


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _tail(text: str, lines: int = 3) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or "no output"
