"""Options several commands take, declared once: trusted keys, the device, ``--json``, the
digest pin, factory overrides and the load precision and layout. The help text stays each command's
where it says something of its own (serve's keys are checked by every replica too)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..format import COMPILED_MODES, LAYOUTS, PRECISIONS, parse_config_items
from ._params import parsed

F = TypeVar("F", bound=Callable[..., Any])
Decorator = Callable[[F], F]

#: ``--device`` of the commands that load an artifact here.
LOAD_DEVICE_HELP = "auto (cuda when available, else cpu), cpu, cuda or cuda:N."
LOAD_PRECISION_HELP = ("Load at this precision (gated here against the artifact's max error) "
                       "instead of the one it records for this device.")


def trusted_keys_option(help: str) -> Decorator:
    """``--key PEM`` (repeatable) → ``keys``: public keys or root certificates the artifact's
    signature must verify with (``Predictor.load(trusted_keys=...)``)."""
    return click.option("--key", "keys", multiple=True,
                        type=click.Path(dir_okay=False, path_type=Path), help=help)


def device_option(help: str, default: str = "auto") -> Decorator:
    return click.option("--device", default=default, show_default=True, help=help)


def json_flag(help: str) -> Decorator:
    """``--json`` → ``as_json``: one JSON document on stdout (the error mapping prints the
    failure document instead when the command fails)."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def expected_digest_option() -> Decorator:
    return click.option("--expected-digest",
                        help="Refuse unless the artifact digest is this sha256:…")


def overrides_option() -> Decorator:
    return click.option("--override", "overrides", multiple=True,
                        callback=parsed(parse_config_items), metavar="KEY=VALUE",
                        help="Override a factory argument at load. Repeatable.")


def load_precision_option(help: str = LOAD_PRECISION_HELP) -> Decorator:
    """``--precision recorded|fp32|tf32|bf16|fp16`` (``LoadOptions.precision``)."""
    return click.option("--precision", type=click.Choice(["recorded", *PRECISIONS]),
                        default="recorded", show_default=True, help=help)


def load_compiled_option() -> Decorator:
    """``--compiled auto|off|shipped|on`` (``LoadOptions.compiled``)."""
    return click.option("--compiled", type=click.Choice(COMPILED_MODES), default="auto",
                        show_default=True,
                        help="Compiled mode: auto serves the AOTInductor packages `warm "
                        "--compiled` shipped for this host where every shape has one; off "
                        "never; shipped serves any precompiled graphs or inductor cache "
                        "shipped for this host; on also compiles here when none are.")


def load_layout_option() -> Decorator:
    """``--layout recorded|contiguous|channels_last`` (``LoadOptions.layout``)."""
    return click.option("--layout", type=click.Choice(["recorded", *LAYOUTS]),
                        default="recorded", show_default=True,
                        help="Capture every shape in this memory layout (gated here against "
                        "the artifact's max error) instead of the one it records for this "
                        "device; channels_last needs an artifact whose build lists it (a "
                        "model with a 2-D convolution, built with --precision).")
