"""The serving path: read and verify an artifact, rebuild its model, capture, replay.

What a production process imports is this package, ``format`` and ``errors`` (plus the
model's own source): nothing of builder, bench, serve or cli.

Public here are the primitives the tools above (builder, bench, serve, predict) share with
the load path, so that each exists once (one capture recipe, one comparison, one device
resolver, one versions function, one output walker). Each module lists what it exports in
its own ``__all__``; this package re-exports those lists and nothing else. Modules that
need neither torch nor numpy import with the package, so that ``inspect`` and ``--help``
stay instant; numpy-only ones each alone on the first use of one of its names; the others
together on the first use of any of their names (``qkan_pack._lazy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._lazy import lazy_getattr, lazy_names, module_exports
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

if TYPE_CHECKING:  # the names resolved on first use, as type checkers see them
    from ._array_files import *  # noqa: F403
    from ._calling import *  # noqa: F403
    from ._capture import *  # noqa: F403
    from ._compat import *  # noqa: F403
    from ._device import *  # noqa: F403
    from ._float64 import *  # noqa: F403
    from ._json_inputs import *  # noqa: F403
    from ._layout import *  # noqa: F403
    from ._load import *  # noqa: F403
    from ._padcheck import *  # noqa: F403
    from ._precision import *  # noqa: F403
    from ._predictor import *  # noqa: F403
    from ._progress import *  # noqa: F403
    from ._report import *  # noqa: F403
    from ._selftest import *  # noqa: F403
    from ._timing import *  # noqa: F403
    from ._tree import *  # noqa: F403
    from ._weights import *  # noqa: F403

_EAGER = (_artifact, _deferred_imports, _files, _kernels, _options, _output_paths, _signature,
          _source, _triton_compat)
#: Modules that need numpy but not torch: looked at first, each alone, so that serve's wire
#: (and its helper process) reads JSON numbers without importing torch, and ``inspect``
#: still imports no numpy.
_ALONE = module_exports(__name__, ["._json_inputs"])
#: Modules that need torch: imported together on the first use of any of their names (a
#: load imports all of them anyway).
_ON_FIRST_USE = module_exports(__name__, [
    "._array_files", "._calling", "._capture", "._compat", "._device", "._float64", "._layout",
    "._load", "._padcheck",
    "._precision", "._predictor", "._progress", "._report", "._selftest", "._timing", "._tree",
    "._weights"])

_resolve = lazy_getattr(__name__, globals(), _ALONE, _ON_FIRST_USE)


def _public() -> list[str]:
    return sorted({*(n for m in _EAGER for n in m.__all__), *lazy_names(_ALONE, _ON_FIRST_USE)})


def __getattr__(name: str) -> Any:
    return _public() if name == "__all__" else _resolve(name)


def __dir__() -> list[str]:
    return _public()
