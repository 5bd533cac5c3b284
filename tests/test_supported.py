"""The supported releases of the libraries whose internals qkan-pack uses: stated once
(``_supported``), used by each seam, and declared alike in pyproject.toml, so that pip never
installs a release a seam refuses (``ray[serve]>=2.40`` once admitted releases ``serve``
refused at start)."""

from __future__ import annotations

import pytest
from packaging.requirements import Requirement

from qkan_pack._supported import ALL, MODEL_SIGNING, RAY, TRITON, UVICORN, ReleaseRange

from .conftest import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _declared(extra: str, distribution: str) -> Requirement:
    """The requirement on ``distribution`` that pyproject's ``extra`` declares."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    found = [Requirement(text) for text in extras[extra]]
    (requirement,) = [r for r in found if r.name == distribution]
    return requirement


def _around(supported: ReleaseRange) -> list[str]:
    """Releases just inside and just outside each end of the range (patch levels included
    where the range counts major and minor only)."""
    versions = []
    for edge in (supported.low, supported.high):
        for step in (-1, 0):
            release = (*edge[:-1], edge[-1] + step)
            if min(release) < 0:
                continue
            dotted = ".".join(map(str, release))
            versions += [f"{dotted}.0", f"{dotted}.99"] if len(edge) == 2 else [dotted]
    return versions


@pytest.mark.parametrize(("extra", "supported"), [("serve", RAY), ("serve", UVICORN),
                                                  ("sign", MODEL_SIGNING)],
                         ids=lambda value: getattr(value, "library", value))
def test_pyproject_declares_what_the_seam_accepts(extra: str, supported: ReleaseRange) -> None:
    requirement = _declared(extra, supported.distribution)
    disagree = [version for version in _around(supported)
                if requirement.specifier.contains(version) != supported.admits(version)]
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    assert disagree == [], (f"pyproject's {requirement} and the seam's {supported.library} "
                            f"{supported} disagree on {disagree}: declare "
                            f"{requirement.name}{extras}{supported.pip_specifier}")


def test_each_range_declared_as_its_own_pip_specifier() -> None:
    """``pip_specifier`` (the fix messages quote it) admits exactly what the range admits."""
    from packaging.specifiers import SpecifierSet

    for supported in ALL:
        specifier = SpecifierSet(supported.pip_specifier)
        assert [v for v in _around(supported)
                if specifier.contains(v) != supported.admits(v)] == [], supported


def test_ranges_read_and_shown() -> None:
    assert [str(r) for r in ALL] == ["3.2–3.7", "2.60.x", "0.30–0.x", "1.1.1"]
    assert [r.pip_specifier for r in ALL] == [">=3.2,<3.8", "==2.60.*", ">=0.30,<1.0", "==1.1.1"]
    admitted = {version: TRITON.admits(version) for version in (
        "3.2.0", "3.7.1", "3.7.1+git12ab", "3.7.0rc1", "3.8.0", "3.1.9", "3", "dev", "")}
    assert admitted == {"3.2.0": True, "3.7.1": True, "3.7.1+git12ab": True, "3.7.0rc1": True,
                        "3.8.0": False, "3.1.9": False, "3": False, "dev": False, "": False}
    assert MODEL_SIGNING.admits("1.1.1") and not MODEL_SIGNING.admits("1.1.2")
    assert not MODEL_SIGNING.admits("1.1")


@pytest.mark.parametrize(("module", "supported"), [
    ("qkan_pack.runtime._triton_compat", TRITON), ("qkan_pack.serve._ray_compat", RAY),
    ("qkan_pack.serve._uvicorn_compat", UVICORN), ("qkan_pack.runtime._signing_compat",
                                                   MODEL_SIGNING)])
def test_each_seam_checks_the_range_stated_once(module: str, supported: ReleaseRange) -> None:
    import importlib

    assert importlib.import_module(module).SUPPORTED is supported


def test_the_installed_release_is_read_without_importing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    installed = {"triton": "3.8.0", "ray": "2.60.1"}

    def version(name: str) -> str:
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(metadata, "version", version)
    assert [r.installed() for r in ALL] == ["3.8.0: outside", "2.60.1", "not installed",
                                            "not installed"]


def test_every_seam_refuses_a_release_in_the_one_message() -> None:
    """The version-gate message is built once (``ReleaseRange.outside``): a seam adds what
    happens instead, never its own wording of the release and the range."""
    assert RAY.outside("2.59.1", "serve refuses to start") == (
        "Ray 2.59.1 is outside the supported range 2.60.x; serve refuses to start")
    package = ROOT / "qkan_pack"
    worded = [str(path.relative_to(ROOT)) for path in package.rglob("*.py")
              if "is outside the supported" in path.read_text() and path.name != "_supported.py"]
    assert worded == []
    seams = ["runtime/_triton_compat.py", "serve/_ray_compat.py", "serve/_uvicorn_compat.py",
             "runtime/_signing_compat.py"]
    assert [seam for seam in seams if "SUPPORTED.outside(" not in (package / seam).read_text()] == []
