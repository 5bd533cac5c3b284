"""``qkan-pack warm``: compile the GPU kernels an artifact needs and ship them inside it.

``warm()`` loads the artifact in a child process whose Triton cache directory starts
empty, so every kernel the model needs for every manifest shape (and Triton's compiled
launcher stubs) lands there; those files are stored under ``kernels/<key>/`` with their
digests in the manifest, and a fresh GPU host of the same kind then loads pre-warmed.
The child also records Triton's installation key (``runtime/_triton_compat``) so that loads
can skip hashing Triton. With ``compiled=True`` the child loads in compiled mode (empty
inductor cache too) and ships its precompiled graphs (``runtime/_precompiled``: traced and
compiled once per shape, loaded later without tracing; the child writes them where the
``runtime.PrecompiledExport`` on its command line says) under ``kernels/<key>-precompiled/``,
named in the set's details; a fresh process then loads the warmed artifact with
``compiled="shipped"`` as a probe, and if that fails (or crashes) the forms are dropped, the
reason recorded (``precompiled_refused``), and inductor's cache artifacts
(``torch.compiler.save_cache_artifacts()``, for torch.compile at load) shipped instead as
``kernels/<key>-inductor.bin``; so are they for a model with no precompiled form (a graph
break).
With ``precision="auto"`` it first times every precision the build allowed on this device
(``_precision.choose_precision``) and records the fastest for this kind of device; the
kernels are then compiled at that precision. The whole read-compile-write holds the
target's writer lock (a concurrent build waits).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DeviceError, KernelCacheError, OptionError
from ..format import AUTO_PRECISION, KERNELS_DIR, KernelSet, PrecisionChoice, check_device_text
from ..runtime import (
    INDUCTOR_MODE,
    PLAN_FILE,
    TRITON_CACHE_ENV,
    PrecompiledExport,
    VerifiedArtifact,
    collect_kernel_cache,
    inductor_file,
    kernel_key,
    kernel_name,
    precompiled_dir,
    read_artifact,
    resolve_device,
    triton_key_file,
)
from ._precision import Timer, choose_precision, record_precision_choice
from ._writer import locked_target, write_artifact

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class WarmResult:
    path: Path
    key: str
    files: int
    bytes: int
    digest: str
    #: What ``precision="auto"`` measured and chose on this device (None: not asked).
    precision: PrecisionChoice | None = None
    #: With ``compiled``: "precompiled graphs" (with their forms, as the probe load reported
    #: them), or why there are none (then inductor's cache).
    compiled: str | None = None
    #: Kernels the fresh-process probe compiled although the set was used, added to it.
    added: tuple[str, ...] = ()


def check_warm_device(device: str) -> torch.device:
    """The GPU ``warm`` compiles for, or a ``DeviceError`` before anything is read or built
    (``build --warm`` checks first, so that a CPU host or a mistyped device fails before the
    build, not after it). ``auto`` is the current GPU."""
    import torch

    check_device_text(device)
    if not torch.cuda.is_available() or device.split(":")[0] == "cpu":
        raise DeviceError(requested=str(device), problem="qkan-pack warm needs a CUDA GPU: "
                          "kernels are compiled for the GPU they run on; run it on a GPU host "
                          "of the kind you deploy to")
    return resolve_device(device)


def warm(path: str | os.PathLike[str], device: str = "cuda", *,
         config_overrides: Mapping[str, object] | None = None,
         compiled: bool = False, precision: str | None = None,
         timer: Timer | None = None) -> WarmResult:
    """Compile every kernel the artifact needs on ``device`` and store them inside it
    (with ``compiled``, inductor's cache for compiled mode as well).

    ``precision="auto"`` first chooses, among the precisions the build allowed, the
    fastest on this device that passes the gate here (``timer``: seconds per call, default
    ``_precision.default_timer``) and records it for this kind of device; on a CPU
    (``device="cpu"``) only that is done (CPUs run no compiled kernels). A model that
    needs no compiled kernel then ships none, instead of failing."""
    if precision not in (None, AUTO_PRECISION):
        raise OptionError(option="precision", value=precision,
                          expected="'auto' (or None: kernels only)")
    choosing = precision == AUTO_PRECISION
    if choosing and device.split(":")[0] == "cpu":
        check_device_text(device)
        target = resolve_device(device)
    else:
        target = check_warm_device(device)
    root = Path(path)
    # from the read to the write, under the writer lock: a build --force installing in
    # between would otherwise be undone by the old artifact plus kernels (it waits instead,
    # then replaces the warmed artifact, as --force says)
    with locked_target(root):
        choice = None
        if choosing:
            choice = choose_precision(root, target, timer=timer,
                                      config_overrides=config_overrides)
            digest = record_precision_choice(root, choice)
            if target.type != "cuda":
                return WarmResult(path=root, key=choice.key, files=0, bytes=0, digest=digest,
                                  precision=choice)
        artifact = read_artifact(root)  # the child loads at the precision just recorded
        key, details = kernel_key(target.index or 0)
        details, shipped = _compile_kernels(root, target, key, details,
                                            config_overrides or {}, compiled,
                                            required=choice is None)
        if not shipped:
            return WarmResult(path=root, key=key, files=0, bytes=0, digest=artifact.digest,
                              precision=choice)
        result = _store(root, artifact, key, details, shipped)
        if compiled:
            result = _probe_precompiled(root, target, key, details, config_overrides or {},
                                        shipped, result)
        return dataclasses.replace(result, precision=choice)


def _compile_kernels(root: Path, target: torch.device, key: str, details: Mapping[str, str],
                     overrides: Mapping[str, object], compiled: bool, *, required: bool = True,
                     precompile: bool = True) -> tuple[dict[str, str], dict[str, bytes]]:
    """Load ``root`` in a child with empty caches; the kernel set's details and files (none,
    when nothing compiled and ``required`` is off)."""
    details = dict(details)
    with tempfile.TemporaryDirectory(prefix="qkan-pack-warm-") as scratch:
        cache, inductor = Path(scratch) / "triton", Path(scratch) / "inductor.bin"
        export = PrecompiledExport(Path(scratch) / "precompiled" if precompile else None)
        _compile_in_child(root, str(target), Path(scratch), overrides, compiled, export)
        shipped = {f"{KERNELS_DIR}/{key}/{name}": data
                   for name, data in collect_kernel_cache(cache).items()}
        if not shipped and not required:
            return details, {}
        if not shipped:
            raise KernelCacheError(
                f"loading {root} on {target} compiled no Triton kernels: nothing to ship "
                "(the model uses only precompiled torch kernels, so cold starts are already warm)"
            )
        forms, refused = export.read()
        if compiled and forms:
            directory = precompiled_dir(f"{KERNELS_DIR}/{key}")
            details["precompiled"] = f"{directory}/{PLAN_FILE}"
            shipped.update({f"{directory}/{name}": data for name, data in forms.items()})
        elif compiled:
            if refused is not None:
                details["precompiled_refused"] = refused[:500]
            details.update(inductor=inductor_file(f"{KERNELS_DIR}/{key}"),
                           inductor_mode=INDUCTOR_MODE)
            shipped[details["inductor"]] = _inductor_bytes(inductor, root)
        record = Path(scratch) / "triton-key.json"
        if record.exists():  # Triton's installation key, so loads can skip hashing it
            details["triton_key"] = triton_key_file(f"{KERNELS_DIR}/{key}")
            shipped[details["triton_key"]] = record.read_bytes()
    return details, shipped


_PROBE = """
import json, sys
from pathlib import Path
from qkan_pack import Predictor
predictor = Predictor.load(sys.argv[1], device=sys.argv[2], compiled="shipped",
                           config_overrides=json.loads(sys.argv[3]))
print(predictor.report.compiled)
for name, data in predictor.report.kernels_compiled.items():
    destination = Path(sys.argv[4], name)
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_bytes(data)
sys.exit(0 if predictor.report.compiled.startswith("precompiled") else 3)
"""
#: A probe load that takes longer is taken as failing (warm holds the writer lock meanwhile).
PROBE_TIMEOUT_S = 900


def _probe_precompiled(root: Path, target: torch.device, key: str, details: Mapping[str, str],
                       overrides: Mapping[str, object], shipped: Mapping[str, bytes],
                       stored: WarmResult) -> WarmResult:
    """Load the warmed artifact in a fresh process as a GPU host would (``compiled=
    "shipped"``). Kernels it still compiled join the set (``_complete``). Precompiled graphs
    that fail there, or crash it, are replaced by inductor's cache (torch.compile at load),
    the reason recorded in the set's details."""
    if "precompiled" not in details:
        return dataclasses.replace(stored, compiled="no precompiled graphs ("
                                   + details.get("precompiled_refused", "none made") + ")")
    with tempfile.TemporaryDirectory(prefix="qkan-pack-probe-") as compiled_there:
        try:
            probe = subprocess.run([sys.executable, "-c", _PROBE, str(root), str(target),
                                    json.dumps(dict(overrides)), compiled_there],
                                   capture_output=True, text=True, check=False,
                                   env={**os.environ, "PYTHONFAULTHANDLER": "1"},
                                   timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            reason = f"a fresh process loading them took over {PROBE_TIMEOUT_S} s"
        else:
            if probe.returncode == 0:  # its report's line ends with the graphs' forms
                said = (probe.stdout.strip() or "no output").splitlines()[-1]
                forms = said.partition("; ")[2]
                compiled = "precompiled graphs" + (f" ({forms})" if forms else "")
                return _complete(root, key, details, shipped, Path(compiled_there),
                                 dataclasses.replace(stored, compiled=compiled))
            # exit 3: it loaded and said why not on stdout; else its error or crash on stderr
            said = ((probe.stdout if probe.returncode == 3 else probe.stderr).strip()
                    or "no output").splitlines()[-1]
            reason = f"a fresh process loading them exited with {probe.returncode}: {said}"
    reason = reason[:500]
    details = {k: v for k, v in details.items() if k != "precompiled"}
    details, shipped = _compile_kernels(root, target, key, details, overrides, True,
                                        precompile=False)
    details["precompiled_refused"] = reason
    result = _store(root, read_artifact(root), key, details, shipped)
    return dataclasses.replace(result, compiled=f"no precompiled graphs ({reason})")


def _complete(root: Path, key: str, details: Mapping[str, str], shipped: Mapping[str, bytes],
              compiled_there: Path, stored: WarmResult) -> WarmResult:
    """The set with the kernels the probe compiled added (``KernelUse.files``: their cache
    files, group indexes relocatable), stored again; ``stored`` when it compiled none."""
    added = {path.relative_to(compiled_there).as_posix(): path.read_bytes()
             for path in sorted(compiled_there.rglob("*")) if path.is_file()}
    if not added:
        return stored
    names = sorted(filter(None, map(kernel_name, added)))
    files = {**shipped, **{f"{KERNELS_DIR}/{key}/{name}": data for name, data in added.items()}}
    result = _store(root, read_artifact(root), key, details, files)
    return dataclasses.replace(result, compiled=stored.compiled, added=tuple(names))


def _inductor_bytes(path: Path, root: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    if not data:
        raise KernelCacheError(
            f"loading {root} in compiled mode left no inductor cache artifacts to ship "
            "(torch.compiler.save_cache_artifacts() returned nothing)")
    return data


def _store(root: Path, artifact: VerifiedArtifact, key: str, details: Mapping[str, str],
           shipped: Mapping[str, bytes]) -> WarmResult:
    """Replace this key's kernel set (files and manifest entry) by the new one."""
    directory = f"{KERNELS_DIR}/{key}"
    own = {inductor_file(directory), triton_key_file(directory)}
    files = {name: data for name, data in artifact.files.items()
             if not name.startswith((directory + "/", precompiled_dir(directory) + "/"))
             and name not in own}
    files.update(shipped)
    kernel_sets = [k for k in artifact.manifest.kernels if k.key != key]
    kernel_sets.append(KernelSet(key=key, directory=directory, details=dict(details)))
    manifest = dataclasses.replace(artifact.manifest, kernels=tuple(kernel_sets))
    _, digest = write_artifact(root, manifest, files, force=True)
    return WarmResult(path=root, key=key, files=len(shipped),
                      bytes=sum(map(len, shipped.values())), digest=digest)


_CHILD = """
import json, sys
from pathlib import Path
from qkan_pack import Predictor
from qkan_pack.runtime import PrecompiledExport, record_installation
root, device, overrides, compiled, inductor, key_record, forms = sys.argv[1:8]
predictor = Predictor.load(root, device=device, kernels="off", compiled="on" if compiled == "1"
                           else "off", config_overrides=json.loads(overrides),
                           export=PrecompiledExport(Path(forms) if forms else None))
if compiled == "1" and predictor.report.compiled.startswith("off"):
    sys.exit(f"compiled mode did not compile: {predictor.report.compiled}")
predictor.close()
record = record_installation()
if record is not None:
    with open(key_record, "w") as handle:
        json.dump(record, handle)
if compiled == "1":
    import torch
    saved = torch.compiler.save_cache_artifacts()
    if saved is not None:
        with open(inductor, "wb") as handle:
            handle.write(saved[0])
"""


def _compile_in_child(root: Path, device: str, scratch: Path, overrides: Mapping[str, object],
                      compiled: bool, export: PrecompiledExport) -> None:
    """Load the artifact in a fresh process whose Triton (and inductor) caches start empty;
    in compiled mode its precompiled graphs go where ``export`` says (its directory is the
    child's last argument; empty: none made)."""
    (scratch / "triton").mkdir()
    env = {**os.environ, TRITON_CACHE_ENV: str(scratch / "triton"),
           "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor-cache")}
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), device, json.dumps(dict(overrides)),
         "1" if compiled else "0", str(scratch / "inductor.bin"),
         str(scratch / "triton-key.json"), str(export.directory or "")],
        env=env, capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise KernelCacheError(f"loading {root} to compile its kernels failed: {last}")
