"""The serving path: read and verify an artifact, rebuild its model, capture, replay.

What a production process imports is this package, ``format`` and ``errors`` (plus the
model's own source): nothing of builder, bench, serve or cli.

Public here are the primitives the tools above (builder, bench, serve, predict) share with
the load path, so that each exists once (one capture recipe, one comparison, one device
resolver, one versions function, one output walker). Each module lists what it exports in
its own ``__all__``; this package re-exports those lists and nothing else. Torch-free
modules import with the package, so that ``inspect`` and ``--help`` stay instant; the
others on the first use of any of their names.
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
    _signature,
    _source,
    _triton_compat,
)
from ._artifact import *  # noqa: F403  (each module's __all__ says what it exports)
from ._deferred_imports import *  # noqa: F403
from ._files import *  # noqa: F403
from ._kernels import *  # noqa: F403
from ._options import *  # noqa: F403
from ._signature import *  # noqa: F403
from ._source import *  # noqa: F403
from ._triton_compat import *  # noqa: F403

_EAGER = (_artifact, _deferred_imports, _files, _kernels, _options, _signature, _source,
          _triton_compat)
#: Modules that need torch: imported together on the first use of any of their names (a
#: load imports all of them anyway).
_ON_FIRST_USE = ("_array_files", "_calling", "_capture", "_compat", "_device", "_load",
                 "_padcheck", "_precision", "_predictor", "_progress", "_report", "_selftest",
                 "_timing", "_tree", "_weights")
_names: dict[str, str] = {}


def _lazy_names() -> dict[str, str]:
    """Name -> module for the torch-backed exports (imports those modules once)."""
    if not _names:
        for module in _ON_FIRST_USE:
            for name in importlib.import_module(f"{__name__}.{module}").__all__:
                _names[name] = module
    return _names


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return sorted({*(n for m in _EAGER for n in m.__all__), *_lazy_names()})
    module = _lazy_names().get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __getattr__("__all__")
