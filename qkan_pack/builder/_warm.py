"""``qkan-pack warm``: compile the GPU kernels an artifact needs and ship them inside it.

``warm()`` loads the artifact in a child process whose Triton cache directory starts
empty, so every kernel the model needs for every manifest shape (and Triton's compiled
launcher stubs) lands there; those files are stored under ``kernels/<key>/`` with their
digests in the manifest, and a fresh GPU host of the same kind then loads pre-warmed.
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

from ..errors import DeviceError, KernelCacheError
from ..format import KERNELS_DIR, KernelSet
from ..runtime import (
    TRITON_CACHE_ENV,
    collect_kernel_cache,
    kernel_key,
    read_artifact,
    resolve_device,
)
from ._writer import write_artifact


@dataclass(frozen=True)
class WarmResult:
    path: Path
    key: str
    files: int
    bytes: int
    digest: str


def warm(path: str | os.PathLike[str], device: str = "cuda", *,
         config_overrides: Mapping[str, object] | None = None) -> WarmResult:
    """Compile every kernel the artifact needs on ``device`` and store them inside it."""
    import torch



    root = Path(path)
    artifact = read_artifact(root)
    if not torch.cuda.is_available() or torch.device(device).type != "cuda":
        raise DeviceError(requested=str(device), problem="qkan-pack warm needs a CUDA GPU: "
                          "kernels are compiled for the GPU they run on; run it on a GPU host "
                          "of the kind you deploy to")
    target = resolve_device(device)
    key, details = kernel_key(target.index or 0)
    with tempfile.TemporaryDirectory(prefix="qkan-pack-warm-") as cache:
        _compile_in_child(root, str(target), cache, config_overrides or {})
        compiled = collect_kernel_cache(Path(cache))
    if not compiled:
        raise KernelCacheError(
            f"loading {root} on {target} compiled no Triton kernels: nothing to ship "
            "(the model uses only precompiled torch kernels, so cold starts are already warm)"
        )
    directory = f"{KERNELS_DIR}/{key}"
    files = {name: data for name, data in artifact.files.items()
             if not name.startswith(directory + "/")}
    files.update({f"{directory}/{name}": data for name, data in compiled.items()})
    kernel_sets = [k for k in artifact.manifest.kernels if k.key != key]
    kernel_sets.append(KernelSet(key=key, directory=directory, details=details))
    manifest = dataclasses.replace(artifact.manifest, kernels=tuple(kernel_sets))
    _, digest = write_artifact(root, manifest, files, force=True)
    return WarmResult(path=root, key=key, files=len(compiled),
                      bytes=sum(map(len, compiled.values())), digest=digest)


def _compile_in_child(root: Path, device: str, cache: str,
                      overrides: Mapping[str, object]) -> None:
    """Load the artifact in a fresh process whose Triton cache starts empty."""
    code = (
        "import json, sys\n"
        "from qkan_pack import Predictor\n"
        "Predictor.load(sys.argv[1], device=sys.argv[2], kernels='off',\n"
        "               config_overrides=json.loads(sys.argv[3])).close()\n"
    )
    env = {**os.environ, TRITON_CACHE_ENV: cache}
    result = subprocess.run(
        [sys.executable, "-c", code, str(root), device, json.dumps(dict(overrides))],
        env=env, capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise KernelCacheError(f"loading {root} to compile its kernels failed: {last}")
