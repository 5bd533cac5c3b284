"""The kernel seam (``runtime/_triton_compat``) against real Triton packages: the newest release
it supports, unpacked on the CPU beside the suite, and the Triton a GPU host has with its CUDA
torch.

Triton imports, hashes its installation and runs its file cache manager without a GPU, so the
parts of it the seam relies on run here for real: ``triton_key()`` rebuilt from a record,
``knobs.cache.dir`` set aside and put back, and a kernel set as ``warm`` records it (written by
Triton's own cache manager, collected and stored by ``warm``'s code) vouched for and read back
through Triton at load. Each check runs in a subprocess with that Triton on ``sys.path``, so the
rest of the suite keeps running without Triton.

``make test`` unpacks the newest supported release into ``.venv/triton-site`` (``pip install
--no-deps --target``) and names it in ``QKAN_PACK_TRITON_SITE``, which makes the test required;
without the variable it runs where that directory exists and is skipped, saying so, where not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qkan_pack.runtime._triton_compat import SUPPORTED

from ..conftest import ROOT

SITE_ENV = "QKAN_PACK_TRITON_SITE"
DEFAULT_SITE = ROOT / ".venv" / "triton-site"
KEY = "sm90-tritonX-torchY-cudaZ-py3-x86_64"

PROBE = r'''
import hashlib, json, os, sys
from pathlib import Path

import torch
import triton
from triton import knobs
from triton.runtime import cache

from qkan_pack.builder import _warm
from qkan_pack.runtime import _kernels, read_artifact, record_installation
from qkan_pack.runtime._triton_compat import cache_knobs, unsupported_triton, vouched_key

root, key = Path(sys.argv[1]), sys.argv[2]
HASH = hashlib.sha256(b"a kernel's compile key").hexdigest()  # its directory: base32 of this
FILES = {"k.cubin": b"\x7fELF cubin", "k.json": b'{"name": "k"}'}
seen = {"version": triton.__version__, "file": triton.__file__, "refused": unsupported_triton(),
        "knob descriptor": cache_knobs() is knobs.cache and "dir" in vars(type(knobs.cache))}


def compile_in_child(root, device, scratch, overrides, compiled, forms):
    """What warm's child leaves in its scratch directory, without a GPU: a kernel's files and
    its group index written by Triton's own cache manager (as its compiler writes them) into
    the cache warm pointed it at, and the installation's key recorded."""
    os.environ["TRITON_CACHE_DIR"] = str(scratch / "triton")
    try:
        manager = cache.get_cache_manager(HASH)
        group = {name: manager.put(data, name) for name, data in FILES.items()}
        manager.put_group("k.json", group)
        (scratch / "triton").mkdir(exist_ok=True)
        (scratch / "triton-key.json").write_text(json.dumps(record_installation()))
    finally:
        del os.environ["TRITON_CACHE_DIR"]


_warm._compile_in_child = compile_in_child
details, shipped = _warm._compile_kernels(root, torch.device("cuda", 0), key, {}, {}, False)
_warm._store(root, read_artifact(root), key, details, shipped)
record = json.loads(shipped[details["triton_key"]])
cache.triton_key.cache_clear()  # recording hashed the installation: start the load without it

artifact = read_artifact(root)
_kernels.kernel_key = lambda index: (key, {})  # this host's key is the set's (no GPU here)
kernel_set, seen["matching"] = _kernels.matching_set(artifact, 0)
if kernel_set is None:  # refused: nothing more to see
    print(json.dumps(seen))
    sys.exit(0)
knobs.cache.dir = "/a/users/own/knob"  # a value set on the knob wins over the variable
original = cache.triton_key
with _kernels.shipped_kernels(artifact, kernel_set) as counts:
    private = os.environ["TRITON_CACHE_DIR"]
    group = cache.get_cache_manager(HASH).get_group("k.json") or {}  # Triton reads the set
    seen["inside"] = {
        "knob follows the private copy": knobs.cache.dir == private,
        "key vouched": cache.triton_key is not original and cache.triton_key() == record["triton_key"],
        "group": sorted(group), "group inside the copy": all(p.startswith(private + "/")
                                                             for p in group.values()),
        "files": all(Path(p).read_bytes() == FILES[name] for name, p in group.items()),
    }
seen["after"] = {"knob": knobs.cache.dir, "key restored": cache.triton_key is original,
                 "hashed during the load": original.cache_info().currsize,
                 "counts": {"shipped": counts.shipped, "compiled": counts.compiled}}
triton_root = Path(cache.__file__).resolve().parent.parent
seen["rebuilt key is triton_key()"] = (vouched_key(record, triton_root, triton.__version__)
                                       == cache.triton_key() == record["triton_key"])
print(json.dumps(seen))
'''


def _site() -> Path:
    """The unpacked Triton: required where ``QKAN_PACK_TRITON_SITE`` names it (CI)."""
    named = os.environ.get(SITE_ENV)
    site = Path(named) if named else DEFAULT_SITE
    if not (site / "triton" / "__init__.py").is_file():
        if named:
            pytest.fail(f"{SITE_ENV}={named} holds no Triton package; `make test` unpacks one "
                        "there (pip install --no-deps --target DIR triton==X.Y.Z)", pytrace=False)
        pytest.skip(f"no Triton unpacked at {DEFAULT_SITE}: `make test` puts the newest supported "
                    f"release there and sets {SITE_ENV}, which makes this test required")
    return site


def _probe(artifact: Path, tmp_path: Path, site: Path | None) -> dict:
    """Run ``PROBE`` on a copy of ``artifact`` with ``site`` (None: the installed Triton)."""
    copy = tmp_path / "artifact"
    shutil.copytree(artifact, copy)
    path = [str(ROOT), *([str(site)] if site else []), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p),
           "TRITON_HOME": str(tmp_path / "home"), "QKAN_PACK_PROGRESS": "0"}
    env.pop("TRITON_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", PROBE, str(copy), KEY], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_the_seam_holds(seen: dict) -> None:
    assert seen["refused"] is None, seen["refused"]
    assert seen["knob descriptor"], "triton.knobs.cache.dir is no longer a class-level knob"
    assert seen["matching"] == f"using shipped kernels {KEY}"
    assert seen["inside"] == {"knob follows the private copy": True, "key vouched": True,
                              "group": ["k.cubin", "k.json"], "group inside the copy": True,
                              "files": True}
    assert seen["after"] == {"knob": "/a/users/own/knob", "key restored": True,
                             "hashed during the load": 0,
                             "counts": {"shipped": 1, "compiled": []}}
    assert seen["rebuilt key is triton_key()"]


def test_the_seam_against_the_newest_supported_triton(mlp_artifact: Path, tmp_path: Path) -> None:
    site = _site()
    seen = _probe(mlp_artifact, tmp_path, site)
    assert Path(seen["file"]).resolve().is_relative_to(site.resolve()), seen["file"]
    _assert_the_seam_holds(seen)
    newest = (SUPPORTED.high[0], SUPPORTED.high[1] - 1)
    assert tuple(map(int, seen["version"].split(".")[:2])) == newest, (
        f"CI exercises Triton {seen['version']}, but the supported range is {SUPPORTED}: "
        "unpack its newest release (TRITON_PIN in the Makefile)")


@pytest.mark.gpu  # Triton comes with CUDA torch: a GPU host's own release
def test_the_seam_against_the_installed_triton(mlp_artifact: Path, tmp_path: Path) -> None:
    pytest.importorskip("triton")
    _assert_the_seam_holds(_probe(mlp_artifact, tmp_path, None))
