"""The ``qkan-pack`` command line: parse, call the library, print.

One module per command (``_build``, ``_inspect`` with its table ``_manifest_table``,
``_verify``, ``_predict``, ``_serve``, ``_bench``, ``_bench_serve``, ``_warm``, ``_sign``),
each registering itself on the group (``_app.cli``); options several commands take are
declared once (``_options``), option text is read by one callback factory (``_params``),
exceptions become one line and an exit code in one place (``_errors``), and text shown to a
person is made visible in one place (``_output``).

Nothing here imports torch at module level, so ``--help`` and ``inspect`` stay instant:
each command imports what it calls inside its body.
"""

from __future__ import annotations

from . import (  # noqa: F401  each module registers its command on `cli`
    _bench,
    _bench_serve,
    _build,
    _inspect,
    _predict,
    _serve,
    _sign,
    _verify,
    _warm,
)
from ._app import cli, main

__all__ = ["cli", "main"]
