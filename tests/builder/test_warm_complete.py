"""warm completes its kernel set from its fresh-process probe: kernels the probe still
compiled (``LoadReport.kernels_compiled``, written where warm told it) join the set, verified
like any other file. On an H100 a fresh load of the HQKAN GPT's precompiled graphs compiled
qkan's ``_pz_encoding_kernel`` under a key the warming process never wrote."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from qkan_pack.builder import _warm, write_artifact
from qkan_pack.format import KernelSet
from qkan_pack.runtime import read_artifact

KEY = "sm90-tritonX-torchY-cudaZ-py3-x86_64"
#: Where a shipped group index points (``runtime._kernels``: relocated at load).
PLACEHOLDER = "/$QKAN_PACK_KERNEL_DIR"
SHIPPED = {f"kernels/{KEY}/abc/k.cubin": b"\x7fELF shipped"}


def _warmed(mlp_artifact: Path, tmp_path: Path) -> Path:
    artifact = read_artifact(mlp_artifact)
    manifest = dataclasses.replace(artifact.manifest, kernels=(
        KernelSet(key=KEY, directory=f"kernels/{KEY}", details={"arch": "sm_90"}),))
    target = tmp_path / "warmed"
    write_artifact(target, manifest, {**artifact.files, **SHIPPED})
    return target


def test_kernels_the_probe_compiled_join_the_set(mlp_artifact: Path, tmp_path: Path) -> None:
    root = _warmed(mlp_artifact, tmp_path)
    probe = tmp_path / "probe"
    (probe / "def").mkdir(parents=True)
    (probe / "def" / "m.cubin").write_bytes(b"\x7fELF compiled by the probe")
    group = {"child_paths": {"m.cubin": f"{PLACEHOLDER}/def/m.cubin"}}
    (probe / "def" / "__grp__m.json").write_text(json.dumps(group))
    stored = _warm.WarmResult(path=root, key=KEY, files=1, bytes=12, digest="d",
                              compiled="precompiled graphs")
    result = _warm._complete(root, KEY, {"arch": "sm_90"}, SHIPPED, probe, stored)
    files = read_artifact(root).files  # digests verified
    assert files[f"kernels/{KEY}/def/m.cubin"] == b"\x7fELF compiled by the probe"
    assert files[f"kernels/{KEY}/abc/k.cubin"] == b"\x7fELF shipped"
    assert result.added == ("m",) and result.compiled == "precompiled graphs"
    assert result.files == 3 and result.digest == read_artifact(root).digest


def test_a_probe_that_compiled_nothing_leaves_the_set(mlp_artifact: Path, tmp_path: Path) -> None:
    root = _warmed(mlp_artifact, tmp_path)
    (tmp_path / "probe").mkdir()
    before = read_artifact(root).digest
    stored = _warm.WarmResult(path=root, key=KEY, files=1, bytes=12, digest=before,
                              compiled="precompiled graphs")
    assert _warm._complete(root, KEY, {}, SHIPPED, tmp_path / "probe", stored) is stored
    assert read_artifact(root).digest == before
