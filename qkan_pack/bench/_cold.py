"""``qkan-pack bench --cold``: process start -> first verified result, in fresh processes.

Startup is the subject, so every measurement is a new interpreter (``python -X importtime
-c _cold_child.py``, this environment inherited), repeated ``runs`` times per variant and
summarised as median and spread. By default each process gets empty ``TRITON_CACHE_DIR``,
``TORCHINDUCTOR_CACHE_DIR`` and ``CUDA_CACHE_PATH`` directories, as on a host that never
compiled anything (what an artifact ships is used; nothing else is cached). What cannot be
emptied without root is said in the report: the OS page cache and Python's bytecode caches
stay warm after the first run.

The breakdown per run: the stages (interpreter start, ``import torch``, ``import
qkan_pack``, the load's stages, the first call), imports by top-level package (the
exclusive ``-X importtime`` times of every module, summed per package, whichever stage
imported it), and which heavy modules ran. Variants: ``predictor`` (the default load),
``compiled`` (``compiled="shipped"``) and ``torch_compile`` (``reduce-overhead``, CUDA).
With ``profile`` one extra, untimed run per variant is profiled (cProfile, load + first
call). Tables and plots: ``_cold_render``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BenchError
from ..runtime import package_versions, progress_bar, read_artifact, resolve_device
from ._machine import machine_info
from ._names import COLD_VARIANTS

COLD_SCHEMA = "qkan-pack-cold/1"
#: Stage order of the breakdown (names as the child and ``predictor.report.stages`` write them).
STAGES = ("python start", "import torch", "import qkan_pack", "verify", "kernel cache", "import",
          "cuda init", "build", "weights", "references", "first forward", "reference self-test",
          "padding self-test", "precision gate",
          "replay baseline", "compile", "capture", "self-test", "load, other", "first call")
FRESH_CACHES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH")
CHILD = Path(__file__).with_name("_cold_child.py")
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
_IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)\s*$")


@dataclass(frozen=True)
class ColdSettings:
    """How to measure: fresh processes per variant, calls per process, caches, profiling."""

    runs: int = 5
    calls: int = 30
    variants: tuple[str, ...] = ("predictor",)
    fresh_caches: bool = True
    profile: bool = False
    timeout: float = 600.0
    config_overrides: dict[str, Any] = field(default_factory=dict)
    #: Compile every importable module into this bytecode cache first and run the processes
    #: with ``PYTHONPYCACHEPREFIX`` there: a host installed with bytecode, measured on one
    #: whose packages have none (None: the environment as it is).
    bytecode_cache: Path | None = None

    def check(self) -> None:
        if self.runs < 1 or self.calls < 2:
            raise BenchError(f"--runs must be at least 1 and calls at least 2 (got runs "
                             f"{self.runs}, calls {self.calls})")
        unknown = [v for v in self.variants if v not in COLD_VARIANTS]
        if unknown or not self.variants:
            raise BenchError(f"cold-start variants {unknown or '(none)'}: choose from "
                             f"{', '.join(COLD_VARIANTS)}")


def run_cold(path: str | Path, device: str = "auto", *, settings: ColdSettings | None = None,
             progress: bool | None = None) -> dict[str, Any]:
    """Fresh-process cold starts of the artifact at ``path`` on ``device``, per variant."""
    settings = settings or ColdSettings()
    settings.check()
    target = resolve_device(device)
    artifact = read_artifact(path)
    report: dict[str, Any] = {
        "schema": COLD_SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "artifact": {"path": str(artifact.path), "digest": artifact.digest,
                     "model": f"{artifact.manifest.model.source}::{artifact.manifest.model.entry}",
                     "config": dict(artifact.manifest.model.config),
                     "shapes": [e.label for e in artifact.manifest.shapes],
                     "kernel_sets": [k.key for k in artifact.manifest.kernels]},
        "device": str(target), "settings": _settings_json(settings),
        "caches": _cache_note(settings.fresh_caches), "variants": {}, "notes": [],
    }
    if settings.bytecode_cache is not None:
        report["bytecode_cache"] = compile_bytecode(settings.bytecode_cache)
    jobs = [(v, i) for v in settings.variants for i in range(settings.runs + settings.profile)]
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for variant, index in progress_bar(jobs, desc="cold starts", enabled=progress):
        if variant == "torch_compile" and target.type != "cuda":
            continue
        runs[variant].append(_child(variant, artifact.path, target, settings,
                                    profile=index == settings.runs))
    for variant in settings.variants:
        if variant == "torch_compile" and target.type != "cuda":
            report["notes"].append('torch.compile(mode="reduce-overhead") serves from CUDA '
                                   "graphs: not measured without CUDA")
            continue
        report["variants"][variant] = summarise(runs[variant], settings.runs)
    report["machine"] = machine_info(target)  # after the runs: no CUDA context meanwhile
    report["versions"] = package_versions("triton", "numpy", "sympy", "matplotlib")
    return report


def _cache_note(fresh: bool) -> str:
    if not fresh:
        return "inherited from this environment (--keep-caches)"
    return ("emptied per process: fresh " + ", ".join(FRESH_CACHES) + "; the OS page cache and "
            "Python bytecode caches cannot be emptied without root and stay warm after run 1")


def _settings_json(settings: ColdSettings) -> dict[str, Any]:
    """The settings as JSON values (the bytecode cache is a path: written as text)."""
    cache = settings.bytecode_cache
    return {**asdict(settings), "variants": list(settings.variants),
            "bytecode_cache": None if cache is None else str(cache)}


def import_roots() -> list[str]:
    """Where this interpreter imports from: the standard library and every ``sys.path``
    folder (site-packages, ``PYTHONPATH`` entries), each once."""
    import sysconfig

    roots = [sysconfig.get_paths()["stdlib"], *sys.path, _PACKAGE_ROOT]
    seen: set[str] = set()
    unique = []
    for root in roots:
        if root and os.path.isdir(root) and (real := os.path.realpath(root)) not in seen:
            seen.add(real)
            unique.append(root)
    return unique


def compile_bytecode(cache: Path, roots: Sequence[str] | None = None) -> dict[str, Any]:
    """Byte-compile ``roots`` (default ``import_roots()``) into the bytecode cache ``cache``
    (``python -X pycache_prefix=cache -m compileall``, every core), as ``pip install`` does
    beside each package; the time it took is reported, never counted in a start."""
    cache.mkdir(parents=True, exist_ok=True)
    roots = list(roots if roots is not None else import_roots())
    started = time.perf_counter()
    # The prefix goes in the environment too: Python 3.12's compileall starts its workers
    # through a forkserver, which does not pass -X pycache_prefix on (they wrote no .pyc there).
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(cache)}
    done = subprocess.run([sys.executable, "-X", f"pycache_prefix={cache}", "-m", "compileall",
                           "-q", "-j", "0", *roots], capture_output=True, text=True, check=False,
                          env=env)
    # compileall exits 1 when some file does not compile (a test fixture with a syntax error,
    # a Python 2 leftover): those modules are never imported; anything else is an error.
    written = sum(1 for _ in cache.rglob(f"*.{sys.implementation.cache_tag}.pyc"))
    sample = _sample_source(roots)
    if done.returncode not in (0, 1) or sample is None or not _cached_in(cache, sample):
        raise BenchError(f"compiling bytecode into {cache} failed (exit status "
                         f"{done.returncode}; {sample or 'no .py file in the roots'} has no "
                         f".pyc there): {_tail(done.stderr or done.stdout)}")
    return {"path": str(cache), "roots": roots, "pyc_files": written,
            "seconds": time.perf_counter() - started}


def _sample_source(roots: Sequence[str]) -> str | None:
    """A module the compile must have covered: the first ``.py`` file of the first root that
    has one, shallowest first (the standard library's own ``abc.py``, say)."""
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    return os.path.join(folder, name)
    return None


def _cached_in(cache: Path, source: str) -> bool:
    """Whether ``source`` has its .pyc under the bytecode prefix ``cache``, where a process
    started with ``PYTHONPYCACHEPREFIX=cache`` looks (stale files of another run count too,
    as they do for that process: compileall leaves up-to-date ones alone)."""
    import importlib.util

    saved, sys.pycache_prefix = sys.pycache_prefix, str(cache)
    try:
        return os.path.isfile(importlib.util.cache_from_source(source))
    finally:
        sys.pycache_prefix = saved


def _child(variant: str, path: Path, target: Any, settings: ColdSettings, *,
           profile: bool) -> dict[str, Any]:
    """One fresh process; its record with the import breakdown added."""
    with tempfile.TemporaryDirectory(prefix="qkan-pack-cold-") as scratch:
        out = Path(scratch) / "result.json"
        args: dict[str, Any] = {
            "mode": "torch_compile" if variant == "torch_compile" else "predictor",
            "compiled": "shipped" if variant == "compiled" else "off",
            "path": str(path), "device": str(target), "calls": settings.calls,
            "overrides": dict(settings.config_overrides), "profile": profile,
            "out": str(out), "launched": time.time()}
        env = _environment(Path(scratch), settings.fresh_caches, settings.bytecode_cache)
        command = [sys.executable, "-X", "importtime", "-c", CHILD.read_text(), json.dumps(args)]
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True,
                                  timeout=settings.timeout, check=False)
        except subprocess.TimeoutExpired:
            return {"stages": [], "profiled": profile,
                    "error": f"no first result within {settings.timeout:.0f}s (timed out)"}
        record = _read(out)
        if done.returncode != 0 and not record.get("error"):
            record["error"] = f"exit status {done.returncode}: {_tail(done.stderr)}"
        record.setdefault("stages", [])
        record["profiled"] = profile
        record["wall_s"] = time.time() - args["launched"]
        record["imports_s"] = imports_by_package(done.stderr)
        return record


def _environment(scratch: Path, fresh: bool, bytecode_cache: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if bytecode_cache is not None:
        env["PYTHONPYCACHEPREFIX"] = str(bytecode_cache)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env["QKAN_PACK_PROGRESS"] = "0"
    if fresh:
        for name in FRESH_CACHES:
            directory = scratch / name.lower()
            directory.mkdir()
            env[name] = str(directory)
    return env


def imports_by_package(stderr: str) -> dict[str, float]:
    """Seconds of ``-X importtime`` per top-level package, exclusive times (each module's own
    body, not the modules it imports), largest first."""
    totals: dict[str, float] = defaultdict(float)
    for line in stderr.splitlines():
        match = _IMPORT_LINE.match(line)
        if match:
            totals[match.group(4).split(".")[0]] += int(match.group(1)) / 1e6
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _tail(text: str, lines: int = 3) -> str:
    kept = [line for line in text.strip().splitlines()
            if line.strip() and not line.startswith("import time:")][-lines:]
    return " | ".join(kept) or "no output"


# -- summary ---------------------------------------------------------------------------------


def summarise(runs: Sequence[dict[str, Any]], timed: int) -> dict[str, Any]:
    """Median and spread over the timed runs that succeeded; the profiled run kept apart."""
    measured = [r for r in runs if not r.get("profiled")][:timed]
    good = [r for r in measured if not r.get("error") and r.get("total_s") is not None]
    profiled = next((r for r in runs if r.get("profiled")), None)
    summary: dict[str, Any] = {
        "runs": list(measured), "ok_runs": len(good),
        "errors": [r["error"] for r in measured if r.get("error")],
        "profile": (profiled or {}).get("profile"),
        "profile_error": (profiled or {}).get("error"),
    }
    if not good:
        return summary
    totals = [r["total_s"] for r in good]
    torch_s = [dict(r["stages"]).get("import torch", 0.0) for r in good]
    summary.update({
        "total_s": _spread(totals),
        "import_torch_s": _spread(torch_s),
        "over_import_torch_s": _spread([t - i for t, i in zip(totals, torch_s)]),
        "stages_s": _median_map([dict(r["stages"]) for r in good], STAGES),
        "imports_s": _median_map([r.get("imports_s", {}) for r in good], ()),
        "first_call_us": statistics.median(r["first_call_us"] for r in good),
        "steady_us": statistics.median(r["steady_us"] for r in good),
        "calls_to_fast": max(r["calls_to_fast"] for r in good),
        "load": good[0].get("load"), "modules": good[0].get("modules"),
        "bytecode": good[-1].get("bytecode"),
        "steady": _median_steady([r["steady"] for r in good if r.get("steady")]),
    })
    return summary


def _median_steady(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Per steady-state figure (numbers), the median over runs; texts from the first run."""
    if not records:
        return None
    merged: dict[str, Any] = dict(records[0])
    for key, value in records[0].items():
        if isinstance(value, (int, float)):
            merged[key] = statistics.median(r[key] for r in records if key in r)
    return merged


def _spread(values: Sequence[float]) -> dict[str, float]:
    low, high = min(values), max(values)
    return {"median": statistics.median(values), "min": low, "max": high,
            "spread_pct": (high - low) / low * 100.0 if low > 0 else 0.0, "n": len(values)}


def _median_map(maps: Sequence[Mapping[str, float]], order: Sequence[str]) -> dict[str, float]:
    """Per key, the median over runs (a key missing from a run counts 0), in ``order`` first."""
    keys = [k for k in order if any(k in m for m in maps)]
    keys += sorted({k for m in maps for k in m} - set(keys))
    medians = {k: statistics.median(m.get(k, 0.0) for m in maps) for k in keys}
    if order:
        return medians
    return dict(sorted(medians.items(), key=lambda item: -item[1]))


def write_cold_json(report: Mapping[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    return path
