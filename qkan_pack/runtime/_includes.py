"""Include modules must not take the name of another module of the host process.

While a model imports, its ``--include``d helpers answer to their plain names process-wide
(``_source._serving``): an include called ``json.py`` would be what ``import json`` gives to
the model, to every library it imports for the first time (which keeps that module for
good) and to any other thread importing in that window. So an include may not be named like
a standard-library or built-in module, a module of an installed package (anything under the
installation's ``site-packages`` or stdlib folders), qkan-pack itself or ``__main__``; nor
like any other module this process has imported or can import from ``sys.path`` (the host
application's own ``settings`` or ``utils``) unless that module's file holds exactly the
include's bytes (the same helper, e.g. a build run from the model's folder).
"""

from __future__ import annotations

import importlib.machinery
import site
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from ..errors import ModelSourceError

#: Internal to ``qkan_pack.runtime``: the package exports nothing from this module.
__all__: list[str] = []

_OWN = ("qkan_pack",)


def refuse_shadowing(modules: Iterable[tuple[str, str, bytes]], shown: str) -> None:
    """``modules``: (module name, artifact path, source bytes) of each include; raise on the
    first whose name belongs to the host's installation or to another module of the host."""
    for module, path, data in modules:
        top = named = module.split(".")[0]
        owner = host_owner(top)
        if owner is None:
            owner, named = other_module(module, data), module
        if owner is not None:
            raise ModelSourceError(
                f"{shown}: the include {path} would be imported as {named!r}, the name of "
                f"{owner}; while the model imports, it would replace that module for the whole "
                f"process: rename the helper (e.g. {top}_helpers.py) and rebuild")


def other_module(name: str, data: bytes) -> str | None:
    """A module ``name`` this process has imported, or would import from ``sys.path``, whose
    file does not hold ``data``; None when there is none or it is the same file's bytes."""
    module = sys.modules.get(name)
    if module is not None:
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        origin = origin or getattr(module, "__file__", None)
    elif "." not in name:
        origin = getattr(_path_spec(name), "origin", None)
        if origin is None:
            return None
    else:
        return None
    if isinstance(origin, str) and _same_bytes(origin, data):
        return None
    return f"another module of this process ({origin or 'no file'})"


def _same_bytes(origin: str, data: bytes) -> bool:
    try:
        return Path(origin).read_bytes() == data
    except (OSError, ValueError):
        return False


def host_owner(name: str) -> str | None:
    """Which part of the host's installation has a top-level module ``name``, or None."""
    if name == "__main__":
        return "the running program (__main__)"
    if name in sys.stdlib_module_names or name in sys.builtin_module_names:
        return "a standard-library module"
    if name in _OWN or name.startswith("qkan_pack_model_"):
        return "qkan-pack's own package"
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None) if module is not None else _path_spec(name)
    if spec is None:
        return None
    places = [spec.origin, *(spec.submodule_search_locations or [])]
    for place in places:
        if place and _in_installation(place):
            return f"an installed package ({place})"
    return None


def _path_spec(name: str) -> importlib.machinery.ModuleSpec | None:
    """Where ``sys.path`` would find ``name``, without importing it or asking meta-path hooks."""
    try:
        return importlib.machinery.PathFinder.find_spec(name)
    except (ImportError, ValueError, OSError):
        return None


def _installation_roots() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    roots = [paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    roots += list(getattr(site, "getsitepackages", list)())
    roots.append(site.getusersitepackages())
    return tuple(Path(root).resolve() for root in roots if root)


def _in_installation(place: str) -> bool:
    try:
        where = Path(place).resolve()
    except (OSError, ValueError):
        return False
    return any(where == root or root in where.parents for root in _installation_roots())
