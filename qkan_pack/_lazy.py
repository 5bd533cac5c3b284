"""Attributes a package resolves on first use, so importing it does not import torch.

The one lazy-import mechanism of the package: the root package and ``bench`` name their
lazy attributes in a table (name -> module); ``runtime``, which re-exports every name its
modules list in ``__all__``, builds its tables from those lists on first need
(``module_exports``), each group of modules imported together.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (docs/ARCHITECTURE.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeAlias

#: Name -> module (relative to the package, ``"._load"``): a fixed table, or a function that
#: makes it on first need (importing the modules it reads).
Table: TypeAlias = Mapping[str, str] | Callable[[], Mapping[str, str]]


def module_exports(package: str, modules: Iterable[str]) -> Callable[[], Mapping[str, str]]:
    """A table of every name ``modules`` (relative names, ``"._load"``) list in ``__all__``:
    the modules are imported together, on the first call, and the table kept."""
    table: dict[str, str] = {}

    def exports() -> Mapping[str, str]:
        if not table:
            for module in modules:
                for name in importlib.import_module(module, package).__all__:
                    table[name] = module
        return table

    return exports


def lazy_getattr(package: str, namespace: dict[str, Any], *tables: Table) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports the module a table names for an attribute on
    first access and caches the value in ``namespace`` (the package's globals). Tables are
    looked at in order: a later one (and the imports it takes) only for names the earlier
    ones do not have."""

    def __getattr__(name: str) -> Any:
        module = next((found for table in tables
                       if (found := _resolved(table).get(name)) is not None), None)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    return __getattr__


def lazy_names(*tables: Table) -> set[str]:
    """Every name the tables resolve (imports what each needs to say)."""
    return {name for table in tables for name in _resolved(table)}


def _resolved(table: Table) -> Mapping[str, str]:
    return table() if callable(table) else table
