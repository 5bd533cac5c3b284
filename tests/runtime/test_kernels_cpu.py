"""Shipped kernel sets without a GPU: relocation, verification, scoping of the cache dir."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from qkan_pack import ArtifactError, KernelCacheError
from qkan_pack.builder import write_artifact
from qkan_pack.format import KernelSet
from qkan_pack.runtime import TRITON_CACHE_ENV, collect_kernel_cache, read_artifact
from qkan_pack.runtime._kernels import (
    _CACHE_PLACEHOLDER,
    _relocate_group,
    matching_set,
    shipped_kernels,
)

from ..conftest import EXAMPLES

KEY = "sm90-tritonX-torchY-cudaZ-py3-x86_64"


def _group(root: str) -> bytes:
    return json.dumps({"child_paths": {"k.cubin": f"{root}/abc/k.cubin",
                                       "k.json": f"{root}/abc/k.json"}}).encode()


def test_group_index_paths_follow_the_cache() -> None:
    moved = json.loads(_relocate_group(_group("/tmp/warm-1"), "/tmp/warm-1", "/srv/private"))
    assert moved["child_paths"] == {"k.cubin": "/srv/private/abc/k.cubin",
                                    "k.json": "/srv/private/abc/k.json"}
    with pytest.raises(KernelCacheError, match="not a Triton group index"):
        _relocate_group(b"not json", "/a", "/b")


ESCAPES = {
    "absolute path elsewhere": "/etc/ld.so.preload",
    "another cache": "/home/user/.triton/cache/abc/k.cubin",
    "dot-dot out of the copy": f"{_CACHE_PLACEHOLDER}/../../tmp/evil.so",
    "dot-dot in the middle": f"{_CACHE_PLACEHOLDER}/abc/../../evil.so",
    "the root itself": f"{_CACHE_PLACEHOLDER}/",
    "a prefix lookalike": f"{_CACHE_PLACEHOLDER}x/abc/k.cubin",
    "not text": 7,
}


@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_group_index_paths_outside_the_copy_are_refused(case: str) -> None:
    """Round 2, finding 9: paths not under the placeholder were passed through unchanged, so
    a shipped index could make Triton load a binary from anywhere on the host."""
    data = json.dumps({"child_paths": {"k.cubin": ESCAPES[case]}}).encode()
    with pytest.raises(KernelCacheError, match="outside the kernel cache"):
        _relocate_group(data, _CACHE_PLACEHOLDER, "/srv/private")


def test_a_shipped_set_with_an_escaping_index_is_refused_at_load(
        with_kernels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    artifact = read_artifact(with_kernels)
    files = dict(artifact.files)
    files[f"kernels/{KEY}/abc/__grp__k.json"] = json.dumps(
        {"child_paths": {"k.cubin": "/etc/ld.so.preload"}}).encode()
    hostile = tmp_path / "hostile"
    write_artifact(hostile, artifact.manifest, files)
    artifact = read_artifact(hostile)  # digests are consistent: only the content is hostile
    monkeypatch.setenv(TRITON_CACHE_ENV, "/users/own/cache")
    with (pytest.raises(KernelCacheError, match=r"__grp__k\.json names '/etc/ld\.so\.preload'"),
          shipped_kernels(artifact, artifact.manifest.kernels[0])):
        pytest.fail("the hostile kernel set was installed")
    assert os.environ[TRITON_CACHE_ENV] == "/users/own/cache"


def test_collecting_a_cache_refuses_paths_outside_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "abc").mkdir(parents=True)
    (cache / "abc" / "__grp__k.json").write_bytes(_group("/elsewhere"))
    with pytest.raises(KernelCacheError, match="outside the kernel cache"):
        collect_kernel_cache(cache)
    (cache / "abc" / "__grp__k.json").write_bytes(_group(str(cache)))
    collected = collect_kernel_cache(cache)
    assert json.loads(collected["abc/__grp__k.json"])["child_paths"]["k.cubin"] == \
        f"{_CACHE_PLACEHOLDER}/abc/k.cubin"


@pytest.fixture
def with_kernels(tmp_path: Path, mlp_artifact: Path) -> Path:
    """A copy of the MLP artifact carrying a (fake) kernel set for KEY."""
    artifact = read_artifact(mlp_artifact)
    directory = f"kernels/{KEY}"
    files = dict(artifact.files)
    files[f"{directory}/abc/k.cubin"] = b"\x7fELF fake cubin"
    files[f"{directory}/abc/__grp__k.json"] = _group(_CACHE_PLACEHOLDER)
    manifest = dataclasses.replace(artifact.manifest, kernels=(
        KernelSet(key=KEY, directory=directory, details={"arch": "sm_90"}),))
    target = tmp_path / "with_kernels"
    write_artifact(target, manifest, files)
    return target


def test_kernel_files_are_verified_like_any_other(with_kernels: Path) -> None:
    assert read_artifact(with_kernels).manifest.kernels[0].key == KEY
    cubin = with_kernels / "kernels" / KEY / "abc" / "k.cubin"
    cubin.write_bytes(b"\x7fELF evil cubin")
    with pytest.raises(ArtifactError, match=r"k\.cubin"):
        read_artifact(with_kernels)


def test_matching_and_mismatching_keys(with_kernels: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    artifact = read_artifact(with_kernels)
    monkeypatch.setattr("qkan_pack.runtime._kernels.kernel_key", lambda index: (KEY, {}))
    found, note = matching_set(artifact, 0)
    assert found is not None and "using shipped kernels" in note
    monkeypatch.setattr("qkan_pack.runtime._kernels.kernel_key", lambda index: ("sm80-other", {}))
    found, note = matching_set(artifact, 0)
    assert found is None and "no shipped kernels for sm80-other" in note and KEY in note


def test_shipped_kernels_a_triton_release_refuses_are_a_warning_in_the_load_report(
        with_kernels: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU load whose Triton is outside the supported range said only "compiled as usual"
    on the report's kernel line: now the report (and so ``verify``, which prints it, and
    ``--json``) carries it as a warning naming the release and the range. Runs without a GPU:
    the release is refused before anything touches CUDA."""
    import sys
    import types

    import torch

    from qkan_pack.runtime import LoadOptions
    from qkan_pack.runtime._load import _kernel_cache, _new_report

    fake = types.ModuleType("triton")
    fake.__version__ = "3.8.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton", fake)
    monkeypatch.setenv(TRITON_CACHE_ENV, "/users/own/cache")
    artifact = read_artifact(with_kernels)
    gpu = torch.device("cuda", 0)
    report = _new_report(artifact, gpu, LoadOptions())
    said = ("shipped kernels not used: Triton 3.8.0 is outside the supported range 3.2–3.7; "
            "kernels are compiled at load instead")
    with pytest.warns(UserWarning, match=said), _kernel_cache(artifact, gpu, "auto", report):
        assert os.environ[TRITON_CACHE_ENV] == "/users/own/cache"  # the shipped set unused
    assert report.kernel_cache.startswith(said)
    assert len(report.warnings) == 1 and report.warnings[0].startswith(said)
    assert f"warning: {said}" in str(report)
    assert report.as_dict()["warnings"] == report.warnings


def test_shipped_kernels_are_private_and_scoped(with_kernels: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRITON_CACHE_ENV, "/users/own/cache")
    artifact = read_artifact(with_kernels)
    kernel_set = artifact.manifest.kernels[0]
    with shipped_kernels(artifact, kernel_set) as counts:
        private = Path(os.environ[TRITON_CACHE_ENV])
        assert private != Path("/users/own/cache") and private.is_dir()
        group = json.loads((private / "abc" / "__grp__k.json").read_text())
        assert group["child_paths"]["k.cubin"] == f"{private}/abc/k.cubin"
        assert (private / "abc" / "k.cubin").read_bytes() == b"\x7fELF fake cubin"
    assert os.environ[TRITON_CACHE_ENV] == "/users/own/cache"
    assert not private.exists()
    assert (counts.shipped, counts.compiled) == (1, [])
    assert read_artifact(with_kernels).digest == artifact.digest  # nothing written back


def test_a_kernel_compiled_during_the_load_is_named(with_kernels: Path) -> None:
    """A kernel Triton compiles inside the scope (the set lacked it) is counted by name, and
    one it rewrote as well: the warning then says which kernels a stale set misses."""
    artifact = read_artifact(with_kernels)
    with shipped_kernels(artifact, artifact.manifest.kernels[0]) as counts:
        private = Path(os.environ[TRITON_CACHE_ENV])
        (private / "def").mkdir()
        (private / "def" / "__grp__triton_poi_fused_add_0.json").write_text("{}")
        rewritten = private / "abc" / "__grp__k.json"
        stat = rewritten.stat()
        os.utime(rewritten, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert (counts.shipped, counts.compiled) == (1, ["k", "triton_poi_fused_add_0"])


def test_the_files_of_a_kernel_compiled_during_the_load_are_kept_as_a_set_ships_them(
        with_kernels: Path) -> None:
    """``KernelUse.files``: the cache files of each kernel compiled in the scope, group
    indexes relocatable (what warm adds after its fresh-process probe), none of the shipped
    ones left unchanged; the report's JSON form leaves the bytes out."""
    artifact = read_artifact(with_kernels)
    with shipped_kernels(artifact, artifact.manifest.kernels[0]) as counts:
        private = Path(os.environ[TRITON_CACHE_ENV])
        (private / "def").mkdir()
        (private / "def" / "m.cubin").write_bytes(b"\x7fELF another")
        (private / "def" / "__grp__m.json").write_bytes(_group(str(private)).replace(
            b"abc/k", b"def/m"))
    assert counts.compiled == ["m"]
    assert sorted(counts.files) == ["def/__grp__m.json", "def/m.cubin"]
    assert json.loads(counts.files["def/__grp__m.json"])["child_paths"]["k.cubin"] == \
        f"{_CACHE_PLACEHOLDER}/def/m.cubin"


def test_loads_with_shipped_kernels_in_two_threads_take_turns(with_kernels: Path) -> None:
    """Audit: two loads in two threads each pointed Triton at their own private copy and
    restored what they had found, out of order; the second ran on without its kernels and
    the process was left pointing Triton at a deleted directory. Now the second waits."""
    import threading

    artifact = read_artifact(with_kernels)
    kernel_set = artifact.manifest.kernels[0]
    original = os.environ.get(TRITON_CACHE_ENV)
    inside = threading.Event()
    release = threading.Event()
    seen: dict[str, str | None] = {}

    def first() -> None:
        with shipped_kernels(artifact, kernel_set):
            seen["first"] = os.environ.get(TRITON_CACHE_ENV)
            inside.set()
            release.wait(10)
            seen["first, before leaving"] = os.environ.get(TRITON_CACHE_ENV)

    def second() -> None:
        with shipped_kernels(artifact, kernel_set):
            seen["second"] = os.environ.get(TRITON_CACHE_ENV)
            seen["second sees the first's copy"] = str(os.path.exists(seen["first"] or ""))

    one = threading.Thread(target=first)
    one.start()
    assert inside.wait(10)
    two = threading.Thread(target=second)
    two.start()
    two.join(0.3)
    assert two.is_alive() and "second" not in seen  # waits while the first loads
    release.set()
    one.join(10)
    two.join(10)
    assert seen["first, before leaving"] == seen["first"] != original
    assert seen["second"] not in (None, original, seen["first"])
    assert seen["second sees the first's copy"] == "False"  # removed, and not pointed at
    assert os.environ.get(TRITON_CACHE_ENV) == original


def test_warm_without_cuda_is_a_clear_error(mlp_artifact: Path) -> None:
    from qkan_pack import DeviceError
    from qkan_pack.builder import warm

    with pytest.raises(DeviceError, match="needs a CUDA GPU"):
        warm(mlp_artifact, "cuda")


def test_build_fixture_is_untouched(mlp_artifact: Path) -> None:
    assert read_artifact(mlp_artifact).manifest.kernels == ()
    assert (EXAMPLES / "qkan_mlp.py").exists()


def test_runtime_older_than_the_build_host_is_refused(mlp_artifact: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from qkan_pack import IncompatibleArtifactError, Predictor

    compat = sys.modules["qkan_pack.runtime._compat"]
    real = compat.package_versions()
    monkeypatch.setattr(compat, "package_versions", lambda: {**real, "qkan": "0.1.0"})
    with pytest.raises(IncompatibleArtifactError, match=r"upgrade qkan to 0\.2"):
        Predictor.load(mlp_artifact)
    monkeypatch.setattr(compat, "package_versions", lambda: {**real, "qkan": "0.2.9"})
    with Predictor.load(mlp_artifact) as predictor:  # same breaking release: loads
        assert predictor.report.warnings == []
