"""Versions: what the producer recorded, what this host runs, and when skew is refused.

``package_versions`` is the one versions function: build records it in the manifest, load
compares against it, bench prints it.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from .._version import __version__
from ..errors import IncompatibleArtifactError
from ..format import Manifest

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["cpu_model", "package_versions"]


#: Packages whose versions the runtime compares with the build host's.
CHECKED_PACKAGES = ("torch", "qkan")


def installed_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def package_versions(*extra: str) -> dict[str, Any]:
    """qkan-pack, torch, qkan, safetensors, Python and the platform (+ ``extra`` packages)."""
    found: dict[str, Any] = {
        "qkan_pack": __version__,
        "torch": torch.__version__,
        "qkan": installed_version("qkan"),
        "safetensors": installed_version("safetensors"),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }
    found.update({name: installed_version(name) for name in extra})
    return found


def check_compatibility(manifest: Manifest, warn: Callable[[str], None]) -> None:
    """Refuse a runtime older than the build host by a breaking version; warn on other skew.

    A model written against a newer torch/qkan may call APIs or rely on numerics this host
    lacks; the self-test catches numeric drift, so smaller skew is a warning.
    """
    here = package_versions()
    for package in CHECKED_PACKAGES:
        built, local = manifest.producer.get(package), here.get(package)
        if not built:
            continue
        if not local:
            warn(f"artifact built with {package} {built}, which is not installed here")
        elif _breaking(built) > _breaking(local):
            raise IncompatibleArtifactError(
                f"artifact built with {package} {built}; this host has {local}, an older "
                f"incompatible release: upgrade {package} to {'.'.join(map(str, _breaking(built)))}"
                " or newer, or rebuild the artifact here"
            )
        elif _release(built)[:2] != _release(local)[:2]:
            warn(f"artifact built with {package} {built}, loading with {local}: "
                 "outputs are checked by the self-test")
    _check_model_packages(manifest, warn)


def _check_model_packages(manifest: Manifest, warn: Callable[[str], None]) -> None:
    """The packages the model source uses (transformers, torchvision, timm...) run at load:
    another release may build another model. The self-test catches numeric differences;
    a warning names the difference."""
    for name, built in manifest.model.packages.items():
        if name in CHECKED_PACKAGES:
            continue
        local = installed_version(name)
        if local is None:
            warn(f"the model source imports {name} ({built} at build), which is not installed "
                 f"here: pip install '{name}=={built}'")
        elif _release(built)[:2] != _release(local)[:2]:
            warn(f"artifact built with {name} {built}, loading with {local}: outputs are "
                 "checked by the self-test")


def _release(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit()) or "0"
        parts.append(int(digits[:9]))
    return tuple(parts)


def _breaking(text: str) -> tuple[int, ...]:
    """The component whose change may break compatibility (semver; 0.x counts the minor)."""
    release = (*_release(text), 0, 0)
    return release[:2] if release[0] == 0 else release[:1]


def cpu_model() -> str:
    """This host's CPU model name (``/proc/cpuinfo``, else ``platform.processor()``); empty
    when neither says (callers pick their own stand-in)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
