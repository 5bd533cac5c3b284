"""Include modules must not take the name of a module of the host's Python installation.

While a model imports, its ``--include``d helpers answer to their plain names process-wide
(``_source._serving``): an include called ``json.py`` would be what ``import json`` gives to
the model, to every library it imports for the first time (which keeps that module for
good) and to any other thread importing in that window. So an include may not be named like
a standard-library or built-in module, a module of an installed package (anything under the
installation's ``site-packages`` or stdlib folders) or qkan-pack itself. A user's own module
of the same name (not part of the installation) stays allowed: it is set aside during the
import and put back after it, as before.
"""

from __future__ import annotations

import importlib.machinery
import site
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from ..errors import ModelSourceError

_OWN = ("qkan_pack",)


def refuse_shadowing(modules: Iterable[tuple[str, str]], shown: str) -> None:
    """``modules``: (module name, artifact path) of each include; raise on the first whose
    top-level name belongs to the host's installation."""
    for module, path in modules:
        top = module.split(".")[0]
        owner = host_owner(top)
        if owner is not None:
            raise ModelSourceError(
                f"{shown}: the include {path} would be imported as {top!r}, the name of "
                f"{owner}; while the model imports, it would replace that module for the whole "
                f"process: rename the helper (e.g. {top}_helpers.py) and rebuild")


def host_owner(name: str) -> str | None:
    """Which part of the host's installation has a top-level module ``name``, or None."""
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
