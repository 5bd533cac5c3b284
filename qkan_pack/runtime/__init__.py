"""The serving path: read and verify an artifact, rebuild its model, capture, replay.

What a production process imports is this package, ``format`` and ``errors`` (plus the
model's own source): nothing of builder, bench, serve or cli.

Public here are the primitives the tools above (builder, bench, serve, predict) share with
the load path, so that each exists once (one capture recipe, one comparison, one device
resolver, one versions function, one output walker). Each module lists what it exports in
its own ``__all__``; this package re-exports those lists and nothing else. Modules that
need neither torch nor numpy import with the package, so that ``inspect`` and ``--help``
stay instant; numpy-only ones each alone on the first use of one of its names; the others
together on the first use of any of their names.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import (
    _artifact,
    _deferred_imports,
    _files,
    _kernels,
    _options,
    _output_paths,
    _signature,
    _source,
    _triton_compat,
)
from ._artifact import *  # noqa: F403  (each module's __all__ says what it exports)
from ._deferred_imports import *  # noqa: F403
from ._files import *  # noqa: F403
from ._kernels import *  # noqa: F403
from ._options import *  # noqa: F403
from ._output_paths import *  # noqa: F403
from ._signature import *  # noqa: F403
from ._source import *  # noqa: F403
from ._triton_compat import *  # noqa: F403

_EAGER = (_artifact, _deferred_imports, _files, _kernels, _options, _output_paths, _signature,
          _source, _triton_compat)
#: Modules that need torch: imported together on the first use of any of their names (a
#: load imports all of them anyway).
_ON_FIRST_USE = ("_array_files", "_calling", "_capture", "_compat", "_device", "_load",
                 "_padcheck", "_precision", "_predictor", "_progress", "_report", "_selftest",
                 "_timing", "_tree", "_weights")
#: Modules that need numpy but not torch: each imported alone on the first use of its names,
#: so that serve's wire (and its helper process) reads JSON numbers without importing torch,
#: and ``inspect`` still imports no numpy.
_ALONE = ("_json_inputs",)
_names: dict[str, str] = {}
_alone_names: dict[str, str] = {}


def _lazy_names() -> dict[str, str]:
    """Name -> module for the torch-backed exports (imports those modules once)."""
    return _exports(_ON_FIRST_USE, _names)


def _names_alone() -> dict[str, str]:
    """Name -> module for the numpy-only exports (imports those modules, not torch)."""
    return _exports(_ALONE, _alone_names)


def _exports(modules: tuple[str, ...], table: dict[str, str]) -> dict[str, str]:
    """``table`` filled once with name -> module for every name ``modules`` export."""
    if not table:
        for module in modules:
            for name in importlib.import_module(f"{__name__}.{module}").__all__:
                table[name] = module
    return table


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return sorted({*(n for m in _EAGER for n in m.__all__), *_names_alone(), *_lazy_names()})
    module = _names_alone().get(name) or _lazy_names().get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __getattr__("__all__")
